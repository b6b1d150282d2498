"""``HFChatTokens`` (the Hugging Face tokenizer saved beside a bundled model's dequantised weights, ``bundled.hf_folder``,
or made from the GGUF) gives what ``ChatTokens`` (llama.cpp on the GGUF) gives: the chat prompt's tokens, the yes/no
ids, the end-of-generation ids and the text of generated tokens. The embedded backend rests on it when both its
engines are torch and llama.cpp is absent (tests/llm/test_without_llama_cpp.py)."""

import pytest

from cqg_ray.llm.engines.bundled import hf_folder_path
from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, answer_messages, cqg_messages, judge_shot_messages, single_answer_messages

PROMPTS = [
    (answer_messages("The Eiffel Tower was completed in 1889.", ["Is it a building?", "Is a year named?"]), ""),
    (cqg_messages(["Whales use echolocation.", "Bats hunt at night, ünïcödé 数据 🎉."], ["Sharks smell blood."], 5), ""),
    (judge_shot_messages("A man plays the flute.", "Is an instrument mentioned?"), ""),
    (single_answer_messages("A cat sat on the mat.", "Is it about an animal?"), SINGLE_ANSWER_PREFIX),
]
REPLIES = ["1. Is it about whales?\n2. Does the text mention a city?", "Ja, ünïcödé 数据 🎉 — “quoted”.", "yes"]


def both(name: str, cache_dir: str | None = None):
    pytest.importorskip("llama_cpp")
    from cqg_ray.config import LlamaCppConfig
    from cqg_ray.llm.engines.bundled import BundledModelError, hf_folder, resolve_model
    from cqg_ray.llm.engines.chat_tokens import ChatTokens, HFChatTokens

    if name == "qwen2.5-coder-1.5b" and not (hf_folder_path(f"bundled:{name}") / "config.json").is_file():
        pytest.skip("the 1.5B's dequantised folder is not on this machine (3.4 GB, minutes to make; the reference build and "
                    "the torch writer make it): checked where it is")
    try:
        resolve_model(f"bundled:{name}")
    except BundledModelError as e:
        pytest.skip(str(e))
    cfg = LlamaCppConfig(model=f"bundled:{name}", cache_dir=cache_dir)
    if cache_dir is None:
        hf_folder(cfg.model)  # made once per machine (the torch engine tests, vLLM set-up)
    return ChatTokens.vocab_only(cfg), HFChatTokens.for_model(cfg)


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m", "qwen2.5-coder-1.5b"])
def test_the_hf_tokenizer_gives_llama_cpps_tokens_ids_and_text(name):
    ours, hf = both(name)
    for messages, prefix in PROMPTS:
        assert hf(messages, prefix) == ours(messages, prefix), messages[-1]["content"][:60]
    assert hf.yes_no_ids() == ours.yes_no_ids() and len(ours.yes_no_ids()) >= 4
    assert hf.eog_ids() == ours.eog_ids()
    for reply in REPLIES:
        ids = ours.model.tokenize(reply.encode(), add_bos=False, special=False)
        assert hf.detokenize(ids) == ours.detokenize(ids) == reply
        for cut in range(1, len(ids)):  # cut anywhere, inside a character too: the bytes that do not decode are dropped
            assert hf.detokenize(ids[:cut]) == ours.detokenize(ids[:cut])
    end = hf.tok.eos_token_id  # a control token: no text in either
    assert hf.detokenize([end]) == ours.detokenize([end]) == ""


def test_before_the_weights_are_dequantised_the_tokenizer_comes_from_the_gguf(tmp_path):
    ours, hf = both("smollm2-135m", cache_dir=str(tmp_path))
    assert not hf_folder_path("bundled:smollm2-135m", str(tmp_path)).exists()  # read from the GGUF, nothing dequantised
    for messages, prefix in PROMPTS:
        assert hf(messages, prefix) == ours(messages, prefix)
    assert hf.eog_ids() == ours.eog_ids()
