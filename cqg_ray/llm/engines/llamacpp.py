"""The embedded CPU backend: llama-cpp-python with a GGUF model (a bundled one by default).

    b = LlamaCppBackend(LLMConfig())                 # in this process (tests, small runs)
    b = LlamaCppActorPool(LLMConfig())               # llamacpp.num_actors Ray actors, one model each (llamacpp_pool.py)

- The chat template is the model's own (read from the GGUF by llama-cpp-python).
- Where both engines (below) are torch, llama.cpp is not loaded at all and need not be installed: the Hugging Face
  tokenizer gives the same tokens (``chat_tokens.HFChatTokens``) and the torch engine decodes every request that
  needs no grammar, sampling retries with their seed; only packed answers under a grammar or with recorded yes/no log
  probabilities still load llama.cpp.
- Sampling: greedy at temperature 0, ``repeat_penalty=1.0`` (llama.cpp's usual 1.1 hurts yes/no lists).
- Constrained answers: a GBNF grammar allowing exactly "1. yes|no\\n" ... "n. yes|no\\n".
- P(yes) (``LLMConfig.logprobs``): a logits processor records, at every generated position, the log
  probabilities of the yes/no tokens ("yes", " yes", "Yes", ...; before the grammar masks anything), so
  no ``logits_all`` buffer (n_ctx x vocabulary floats) is needed.
- Model: ``llamacpp.model`` is a bundled model (``bundled:<name>``, no model hub), a GGUF path, or a hub repo and file
  (``owner/repo:file.gguf``); ``bundled.resolve_model`` turns it into a local file.
- Build: ``pip install "cqg-ray[llamacpp]"`` compiles llama-cpp-python with its default flags; ``scripts/install_llama_cpp.py``
  (CI, scripts/setup.sh) compiles it for this CPU's flags with AMX off and caches the wheel per CPU feature set. A
  default (``GGML_NATIVE=ON``) build crashes at the first decode on CPUs with AMX (ggml's AMX matmul, reached through
  the "extra buffer types"); so on a CPU with AMX the model is loaded with ``use_extra_bufts=False``, which avoids
  that path whatever the build (same speed, per ENVIRONMENT.md).
- Consecutive prompts sharing a prefix reuse llama.cpp's KV cache for that prefix (llama-cpp-python keeps
  the previous prompt's tokens), which is why the runner sorts requests by prompt.
- Single-pass requests (``Request.yes_no``) never decode: ``BatchEngine.score`` (``cqg_ray.llm.engines.batch``) evaluates
  each group of prompts sharing a text once, with every question's suffix in the same batch, and reads P(yes)
  from the logits after each suffix. Greedy generation requests (temperature 0, no grammar) are decoded
  ``llamacpp.batch_generate`` at a time by the ``llamacpp.generate_engine``: ``BatchEngine.generate`` (llama.cpp,
  continuous batching) or ``TorchEngine.generate`` (torch on the dequantised weights, static batches); the rest (packed answers under a grammar,
  retries at a higher temperature) go one at a time through ``create_chat_completion``.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Iterator, Sequence

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.hardware import available_cpus, cpu_flags
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, answer_gbnf, in_order, llama_cpp_installed, resolve_engine
from cqg_ray.llm.engines.batch import BatchEngine
from cqg_ray.llm.engines.bundled import resolve_model
from cqg_ray.llm.engines.chat_tokens import INSTALL_HINT, ChatTokens, HFChatTokens, chat_tokens
from cqg_ray.llm.parse import loops, p_yes_from_tokens


def cpu_has_amx() -> bool:
    """The hardware's AMX, whatever CQG_RAY_MAX_CPU_ISA says: the crash workaround follows the CPU, not a choice."""
    return "amx_tile" in cpu_flags(capped=False)


@contextlib.contextmanager
def _without_extra_bufts():
    """Load a model with ``use_extra_bufts=False`` (the AMX crash workaround)."""
    import llama_cpp.llama_cpp as lc

    original = lc.llama_model_default_params

    def patched():
        params = original()
        params.use_extra_bufts = False
        return params

    lc.llama_model_default_params = patched
    try:
        yield
    finally:
        lc.llama_model_default_params = original


class YesNoRecorder:
    """Logits processor: at each generated position, log P of every yes/no token (by token id)."""

    def __init__(self, token_ids: dict[int, str]):
        import numpy as np

        self.np = np
        self.token_ids = token_ids
        self.ids = np.array(sorted(token_ids), dtype=np.int64)
        self.steps: list[dict[str, float]] = []
        self.input_lengths: list[int] = []

    def __call__(self, input_ids, logits):
        np = self.np
        x = np.asarray(logits, dtype=np.float64)
        m = float(x.max())
        lse = m + math.log(float(np.exp(x - m).sum()))
        self.steps.append({self.token_ids[int(i)]: float(x[i]) - lse for i in self.ids if i < len(x)})
        self.input_lengths.append(len(input_ids))
        return logits


def batch_decoded(llm: LLMConfig, req: Request) -> bool:
    """Whether a request is decoded ``llamacpp.batch_generate`` at a time: greedy, no grammar, no logprobs to record."""
    temperature = llm.temperature if req.temperature is None else req.temperature
    packed = req.n_answers is not None
    return (not req.yes_no and llm.llamacpp.batch_generate > 1 and temperature == 0
            and not (llm.constrained and packed) and not (llm.logprobs and packed))


def engines(cfg: Any) -> dict[str, str]:
    """The engine of each kind of work (``score``, ``generate``) for a ``LlamaCppConfig``, ``auto`` resolved."""
    return {"score": resolve_engine(cfg.score_engine, work="score"), "generate": resolve_engine(cfg.generate_engine, work="generate")}


def torch_only(cfg: Any) -> bool:
    """Whether both engines of a ``LlamaCppConfig`` are torch: then llama.cpp is loaded only for what torch does not do."""
    return "llamacpp" not in engines(cfg).values()


def context_error(prompt_tokens: int, max_tokens: int, n_ctx: int) -> Completion | None:
    """A final error where a prompt and its reply do not fit in one sequence's context, else None."""
    if prompt_tokens + max_tokens <= n_ctx:
        return None
    return Completion("", prompt_tokens, error=f"{prompt_tokens} prompt tokens + max_tokens={max_tokens} exceed n_ctx={n_ctx}", final=True)


class LlamaCppBackend(Backend):
    name = "llamacpp"
    batch_size = 1

    def __init__(self, llm: LLMConfig, n_threads: int | None = None):
        super().__init__(llm)
        cfg = llm.llamacpp
        self.model_path = resolve_model(cfg.model, cfg.cache_dir)
        self.n_threads = n_threads or cfg.n_threads or available_cpus()
        self.engines = engines(cfg)
        self.torch_only = "llamacpp" not in self.engines.values()  # as ``torch_only(cfg)``, from the engines resolved once
        self._model: Any = None
        self._tokens: ChatTokens | HFChatTokens | None = None
        self._grammars: dict[int, Any] = {}
        self._yes_no_ids: dict[int, str] | None = None
        self._engine: BatchEngine | None = None
        self._scorer: Any = None
        self._generator: Any = None
        self._torch: dict[str, Any] = {}  # dtype -> TorchEngine, one per dtype (scoring and generation share it)
        self._eog: list[int] | None = None
        if not self.torch_only:
            self.model  # loaded now: a missing llama-cpp-python fails here, with the install hint

    @property
    def model(self) -> Any:
        """The llama.cpp model (loaded on first use)."""
        if self._model is None:
            try:
                from llama_cpp import Llama
            except ImportError:
                raise BackendError(f"llama-cpp-python is not installed; install it with:\n  {INSTALL_HINT}") from None
            cfg = self.llm.llamacpp
            guard = _without_extra_bufts() if cpu_has_amx() else contextlib.nullcontext()
            with guard:
                self._model = Llama(model_path=str(self.model_path), n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_threads=self.n_threads,
                                    n_threads_batch=self.n_threads, seed=0, verbose=False)
        return self._model

    @property
    def tokens(self) -> ChatTokens | HFChatTokens:
        """The chat prompt's tokens and the vocabulary's: llama.cpp's where an engine is llama.cpp, else the Hugging Face
        tokenizer's (the same tokens for the bundled models, tests/llm/test_chat_tokens.py)."""
        if self._tokens is None:
            self._tokens = chat_tokens(self.llm.llamacpp, None if self.torch_only else self.model)
        return self._tokens

    def torch_engine(self, dtype: str) -> Any:
        """A ``TorchEngine`` on this model's weights dequantised once into the cache (``bundled.hf_folder``), one per dtype."""
        if dtype not in self._torch:
            from cqg_ray.llm.engines.bundled import hf_folder
            from cqg_ray.llm.engines.torch_engine import TorchEngine

            cfg = self.llm.llamacpp
            self._torch[dtype] = TorchEngine(hf_folder(cfg.model, cfg.cache_dir), dtype=dtype, n_threads=self.n_threads, max_seqs=cfg.score_batch,
                                             gen_seqs=cfg.batch_generate, eos_ids=self.eog_ids())
        return self._torch[dtype]

    def engine_for(self, work: str) -> Any:
        """The engine of this kind of work (``self.engines``, ``auto`` resolved): this model's ``BatchEngine`` or a ``TorchEngine``."""
        name = self.engines[work]
        return self.engine if name == "llamacpp" else self.torch_engine(name.split("-", 1)[1])

    @property
    def scorer(self) -> Any:
        """The single-pass engine (``llamacpp.score_engine``)."""
        if self._scorer is None:
            self._scorer = self.engine_for("score")
        return self._scorer

    @property
    def generator(self) -> Any:
        """The batched generation engine (``llamacpp.generate_engine``)."""
        if self._generator is None:
            self._generator = self.engine_for("generate")
        return self._generator

    def eog_ids(self) -> list[int]:
        """The model's end-of-generation tokens (llama.cpp's ``is_eog``: end of text, end of turn, ...)."""
        if self._eog is None:
            self._eog = self.tokens.eog_ids()
        return self._eog

    @property
    def score_ctx(self) -> int:
        """The tokens a single-pass prompt may have (every scoring engine's limit)."""
        return max(self.llm.llamacpp.n_ctx, 2048)

    @property
    def engine(self) -> BatchEngine:
        """Batched scoring and generation contexts over this model (made on first use)."""
        if self._engine is None:
            cfg = self.llm.llamacpp
            self._engine = BatchEngine(self.model, self.n_threads, score_seqs=cfg.score_batch, score_ctx=self.score_ctx,
                                       gen_seqs=cfg.batch_generate, gen_ctx_per_seq=cfg.n_ctx)
        return self._engine

    def prompt_tokens(self, req: Request) -> list[int]:
        """The chat-templated prompt's tokens, exactly as ``create_chat_completion`` builds them (the GGUF's template),
        then a single-pass request's ``answer_prefix``."""
        return self.tokens(req.messages, req.answer_prefix)

    def prompt_budget(self) -> Any:
        """n_ctx and this model's own tokens (``cqg_ray.llm.fit``)."""
        from cqg_ray.llm.fit import PromptBudget, template_overhead

        count = lambda req: len(self.prompt_tokens(req))  # noqa: E731
        return PromptBudget(self.llm.llamacpp.n_ctx, count, tokenizer_name(self.tokens, self.llm.llamacpp.model), overhead=template_overhead(count))

    def yes_no_token_sets(self) -> tuple[list[int], list[int]]:
        ids = self.yes_no_ids()
        yes = [i for i, w in ids.items() if w.strip().lower() == "yes"]
        no = [i for i, w in ids.items() if w.strip().lower() == "no"]
        return yes, no

    def score(self, requests: Sequence[Request], share_prefix: bool = True) -> list[Completion]:
        """Single-pass answers: P(yes) at the first answer position of each prompt, prompts sharing a text batched."""
        tokens = [self.prompt_tokens(r) for r in requests]
        yes, no = self.yes_no_token_sets()
        out: list[Completion | None] = [None] * len(requests)
        limit = self.score_ctx
        fits = [i for i, t in enumerate(tokens) if len(t) <= limit]
        for i in set(range(len(requests))) - set(fits):
            out[i] = Completion("", len(tokens[i]), error=f"the prompt has {len(tokens[i])} tokens, more than n_ctx={limit}", final=True)
        scored = self.scorer.score([tokens[i] for i in fits], yes, no, share_prefix=share_prefix)
        for i, (p, cached) in zip(fits, scored):
            out[i] = Completion("yes" if p > 0.5 else "no", len(tokens[i]), 0, [p], cached_tokens=cached)
        return out  # type: ignore[return-value]

    def generate_batched(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        """Greedy completions of several prompts decoded together, as each finishes."""
        tokens = [self.prompt_tokens(r) for r in requests]
        errors = [context_error(len(t), r.max_tokens, self.llm.llamacpp.n_ctx) for t, r in zip(tokens, requests)]  # per sequence
        ok = [i for i, e in enumerate(errors) if e is None]
        for i, e in enumerate(errors):
            if e is not None:
                yield i, e
        for j, out in self.generator.generate([tokens[i] for i in ok], [requests[i].max_tokens for i in ok],
                                              stop=self.loop_stop([requests[i] for i in ok])):
            i = ok[j]
            yield i, Completion(self.tokens.detokenize(out), len(tokens[i]), len(out))

    def loop_stop(self, requests: Sequence[Request]) -> Callable[[int, list[int]], bool] | None:
        """The engines' ``stop`` for ``requests``: a ``stop_on_loop`` reply ends at the newline where it has begun to
        loop (``parse.loops``); None where no request asks."""
        if not any(r.stop_on_loop for r in requests):
            return None
        text = self.tokens.detokenize
        return lambda i, out: requests[i].stop_on_loop and "\n" in text(out[-1:]) and loops(text(out))

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        single = [i for i, r in enumerate(requests) if r.yes_no]
        batched = [i for i, r in enumerate(requests) if batch_decoded(self.llm, r)]
        rest = sorted(set(range(len(requests))) - set(single) - set(batched))
        chunk = self.llm.llamacpp.score_batch  # one batch per call: results reach the ledger batch by batch
        for s in range(0, len(single), chunk):
            idx = single[s : s + chunk]
            # a plain loop, not ``yield from zip(...)``: Ray drives a streaming generator with send(), which a zip
            # object does not have
            for i, c in zip(idx, self.score([requests[i] for i in idx])):
                yield i, c
        if batched:
            for j, c in self.generate_batched([requests[i] for i in batched]):
                yield batched[j], c
        for i in rest:
            yield i, self.complete_one(requests[i])

    def grammar(self, n: int):
        from llama_cpp import LlamaGrammar

        if n not in self._grammars:
            self._grammars[n] = LlamaGrammar.from_string(answer_gbnf(n), verbose=False)
        return self._grammars[n]

    def yes_no_ids(self) -> dict[int, str]:
        """Token id -> text for the single-token spellings of yes/no in this model's vocabulary."""
        if self._yes_no_ids is None:
            self._yes_no_ids = self.tokens.yes_no_ids()
        return self._yes_no_ids

    def complete_one(self, req: Request) -> Completion:
        """One request decoded on its own: by the torch generator where both engines are torch and the request needs
        no grammar and no recorded yes/no log probabilities (greedy, or sampled at its temperature and seed), else by
        llama.cpp's ``create_chat_completion``."""
        records = self.llm.logprobs and req.n_answers is not None
        if self.torch_only and not self.constrained(req) and not records:
            return self.complete_torch(req)
        if self.torch_only and not llama_cpp_installed():
            raise BackendError(f"packed answers {'under a grammar (llm.constrained)' if self.constrained(req) else 'with P(yes) (llm.logprobs)'} "
                               f"need llama-cpp-python, which is not installed. Install it with: {INSTALL_HINT}\nor answer single-pass "
                               "(llm.answer_mode: single)")
        from llama_cpp import LogitsProcessorList

        kwargs: dict[str, Any] = {
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "temperature": self.temperature(req),
            "repeat_penalty": 1.0,
        }
        if req.seed is not None:
            kwargs["seed"] = req.seed
        if self.constrained(req):
            kwargs["grammar"] = self.grammar(req.n_answers)  # type: ignore[arg-type]
        recorder = None
        if records:
            recorder = YesNoRecorder(self.yes_no_ids())
            kwargs["logits_processor"] = LogitsProcessorList([recorder])
        t0 = time.perf_counter()
        try:
            out = self.streamed_until_loop(req, kwargs) if req.stop_on_loop else self.model.create_chat_completion(**kwargs)
        except ValueError as e:  # e.g. the prompt does not fit in n_ctx
            return Completion("", error=f"llama.cpp: {e}")
        text = out["choices"][0]["message"].get("content") or ""
        usage = out.get("usage") or {}
        pt, ct = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)  # one call: its time counted as generating
        progress.add(handed=1, planned=pt, read=pt, generated=ct, generate_s=time.perf_counter() - t0)
        p_yes = None
        if recorder is not None and recorder.steps:
            p_yes = p_yes_from_tokens(self._recorded_tokens(recorder), req.n_answers)  # type: ignore[arg-type]
        return Completion(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), p_yes)

    def streamed_until_loop(self, req: Request, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``create_chat_completion(**kwargs)`` streamed, and closed (decoding ends) at the newline where the list loops
        (``parse.loops``): its text and usage (the prompt's tokens as ``prompt_tokens`` counts them, the content
        chunks as the tokens written: llama.cpp streams a chunk a token)."""
        chunks, text, written = self.model.create_chat_completion(**kwargs, stream=True), "", 0
        try:
            for chunk in chunks:
                delta = chunk["choices"][0]["delta"].get("content") or ""
                text, written = text + delta, written + bool(delta)
                if "\n" in delta and loops(text):
                    break
        finally:
            chunks.close()
        return {"choices": [{"message": {"content": text}}], "usage": {"prompt_tokens": len(self.prompt_tokens(req)), "completion_tokens": written}}

    def complete_torch(self, req: Request) -> Completion:
        """One request on the torch generator: greedy at temperature 0, else sampled with its seed."""
        tokens = self.prompt_tokens(req)
        error = context_error(len(tokens), req.max_tokens, self.llm.llamacpp.n_ctx)
        if error is not None:
            return error
        ((_, out),) = list(self.generator.generate([tokens], [req.max_tokens], temperature=self.temperature(req), seed=req.seed or 0,
                                                   stop=self.loop_stop([req])))
        return Completion(self.tokens.detokenize(out), len(tokens), len(out))

    def _recorded_tokens(self, rec: YesNoRecorder) -> list[tuple[str, float, dict[str, float]]]:
        """(chosen token text, its log P if a yes/no token, yes/no alternatives) for each generated position."""
        start = rec.input_lengths[0]
        generated = list(self.model._input_ids[start:])  # tokens evaluated after the prompt
        out = []
        for k, alts in enumerate(rec.steps):
            if k < len(generated):
                text = self.model.detokenize([int(generated[k])]).decode("utf-8", errors="ignore")
            else:
                text = ""  # the last token (end of text or a stop) is never evaluated
            out.append((text, alts.get(text, float("-inf")), alts))
        return out

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        return in_order(self.stream(requests), len(requests))

    def close(self) -> None:
        for engine in getattr(self, "_torch", {}).values():
            engine.close()
        self._torch, self._scorer, self._generator = {}, None, None
        if getattr(self, "_engine", None) is not None:
            self._engine.close()
            self._engine = None
        model = getattr(self, "_model", None)
        if model is not None:
            model.close()
            self._model = None


def tokenizer_name(tokens: Any, model: str) -> str:
    return f"{'llama.cpp' if isinstance(tokens, ChatTokens) else 'Hugging Face'} tokenizer of {model}"


def llamacpp_budget(llm: LLMConfig) -> Any:
    """The embedded engine: the model's own tokenizer and chat template (llama.cpp's, the vocabulary only, where an
    engine is llama.cpp; else the Hugging Face tokenizer's), its n_ctx."""
    from cqg_ray.llm.fit import PromptBudget, template_overhead

    cfg = llm.llamacpp
    tokens = HFChatTokens.for_model(cfg) if torch_only(cfg) else ChatTokens.vocab_only(cfg)

    def count(req: Request) -> int:
        return len(tokens(req.messages, req.answer_prefix))

    return PromptBudget(cfg.n_ctx, count, tokenizer_name(tokens, cfg.model), overhead=template_overhead(count))
