"""A model's chat prompt as tokens, and what the embedded engines read of its vocabulary, from llama.cpp or without it.

    tokens = chat_tokens(llm.llamacpp)                      # HFChatTokens: the Hugging Face tokenizer, no llama.cpp
    ids = tokens(messages, answer_prefix)                   # the chat-templated prompt, then a reply's start
    tokens.yes_no_ids(), tokens.eog_ids(), tokens.detokenize(ids)

``ChatTokens`` reads a loaded llama.cpp model (its GGUF's template, as ``create_chat_completion`` builds prompts);
``HFChatTokens`` reads the Hugging Face tokenizer saved beside the dequantised weights (``bundled.hf_folder``), or
made from the GGUF when those do not exist yet. For the bundled models both give the same tokens, yes/no ids,
end-of-generation ids and text (tests/llm/test_chat_tokens.py), so the torch engines need no llama.cpp.
"""

from __future__ import annotations

from typing import Any, Sequence

from cqg_ray.llm.base import BackendError
from cqg_ray.llm.engines.bundled import gguf_read_once, hf_folder_path, resolve_model

INSTALL_HINT = 'pip install "cqg-ray[llamacpp]"   (in a checkout: bash scripts/setup.sh --llama-cpp, a build for this CPU, cached)'
YES_NO_WORDS = ("yes", " yes", "Yes", " Yes", "YES", " YES", "no", " no", "No", " No", "NO", " NO")
# token texts that end generation, as llama.cpp (llama-vocab.cpp) finds them: end of turn or text, and the
# fill-in-the-middle pad, repository and file-separator tokens
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
                       "<｜end▁of▁sentence｜>", "</s>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>",
                       "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"})


def single_token_words(encode) -> dict[int, str]:
    """Token id -> text for the spellings of yes/no (``YES_NO_WORDS``) that ``encode`` makes one token."""
    ids = {}
    for word in YES_NO_WORDS:
        toks = encode(word)
        if len(toks) == 1:
            ids[toks[0]] = word
    return ids


class ChatTokens:
    """A llama.cpp model's chat-templated prompt tokens, as ``create_chat_completion`` builds them (the GGUF's template),
    then a reply's start (``answer_prefix``). ``vocab_only`` loads the tokenizer alone (~0.2 s, no weights)."""

    def __init__(self, model: Any, name: Any = ""):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = model.metadata.get("tokenizer.chat_template")
        if not template:
            raise BackendError(f"{name} has no chat template; chat prompts need one")
        eos, bos = model.token_eos(), model.token_bos()
        self.model = model
        self.formatter = Jinja2ChatFormatter(template=template, eos_token=model._model.token_get_text(eos) if eos != -1 else "",
                                             bos_token=model._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])

    @classmethod
    def vocab_only(cls, cfg: Any) -> "ChatTokens":
        """From a ``LlamaCppConfig``: the model's vocabulary and template only."""
        try:
            from llama_cpp import Llama
        except ImportError:
            raise BackendError(f"llama-cpp-python is not installed; install it with:\n  {INSTALL_HINT}") from None
        path = resolve_model(cfg.model, cfg.cache_dir)
        return cls(Llama(model_path=str(path), vocab_only=True, verbose=False), path)

    def __call__(self, messages: list[dict[str, str]], answer_prefix: str = "") -> list[int]:
        res = self.formatter(messages=messages)
        tokens = self.model.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True)
        if answer_prefix:  # the start of the reply, after the template's assistant header
            tokens += self.model.tokenize(answer_prefix.encode("utf-8"), add_bos=False, special=False)
        return tokens

    def yes_no_ids(self) -> dict[int, str]:
        """Token id -> text for the single-token spellings of yes/no in this model's vocabulary."""
        return single_token_words(lambda word: self.model.tokenize(word.encode(), add_bos=False, special=False))

    def eog_ids(self) -> list[int]:
        """The model's end-of-generation tokens (llama.cpp's ``is_eog``: end of text, end of turn, ...)."""
        import llama_cpp as lc

        vocab = lc.llama_model_get_vocab(self.model._model.model)
        return [t for t in range(int(lc.llama_vocab_n_tokens(vocab))) if lc.llama_vocab_is_eog(vocab, t)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.model.detokenize(list(ids)).decode("utf-8", errors="ignore")


class HFChatTokens:
    """The same as ``ChatTokens`` from a Hugging Face tokenizer: its chat template, its vocabulary."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    @classmethod
    def for_model(cls, cfg: Any) -> "HFChatTokens":
        """From a ``LlamaCppConfig``: the tokenizer saved beside the model's dequantised weights, or, before those exist,
        the one transformers reads from the GGUF (seconds; the weights are not read)."""
        from transformers import AutoTokenizer

        folder = hf_folder_path(cfg.model, cfg.cache_dir)
        if (folder / "tokenizer_config.json").is_file():
            return cls(AutoTokenizer.from_pretrained(str(folder)))
        gguf = resolve_model(cfg.model, cfg.cache_dir)
        with gguf_read_once():
            return cls(AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name))

    def __call__(self, messages: list[dict[str, str]], answer_prefix: str = "") -> list[int]:
        if not self.tok.chat_template:
            raise BackendError(f"{self.tok.name_or_path} has no chat template; chat prompts need one")
        tokens = list(self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        if answer_prefix:
            tokens += self.tok.encode(answer_prefix, add_special_tokens=False)
        return tokens

    def yes_no_ids(self) -> dict[int, str]:
        return single_token_words(lambda word: self.tok.encode(word, add_special_tokens=False))

    def eog_ids(self) -> list[int]:
        """The tokens whose text llama.cpp takes for an end of generation (``EOG_TEXTS``), and the tokenizer's end token."""
        vocab = self.tok.get_vocab()
        ids = {i for text, i in vocab.items() if text in EOG_TEXTS}
        if self.tok.eos_token_id is not None:
            ids.add(int(self.tok.eos_token_id))
        return sorted(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of generated tokens, special ones left out; bytes that do not decode (a reply cut inside a
        character) dropped, as llama.cpp's text is decoded."""
        return self.tok.decode(list(ids), skip_special_tokens=True).replace("\ufffd", "")


def chat_tokens(cfg: Any, model: Any = None) -> ChatTokens | HFChatTokens:
    """``ChatTokens`` over a loaded llama.cpp ``model``, else ``HFChatTokens`` for the config's model."""
    return ChatTokens(model, resolve_model(cfg.model, cfg.cache_dir)) if model is not None else HFChatTokens.for_model(cfg)
