"""The embedded CPU backend: llama-cpp-python with a GGUF model (a bundled one by default).

    b = LlamaCppBackend(LLMConfig())                 # in this process (tests, small runs)
    b = LlamaCppActorPool(LLMConfig())               # llamacpp.num_actors Ray actors, one model each

- The chat template is the model's own (read from the GGUF by llama-cpp-python).
- Sampling: greedy at temperature 0, ``repeat_penalty=1.0`` (llama.cpp's usual 1.1 hurts yes/no lists).
- Constrained answers: a GBNF grammar allowing exactly "1. yes|no\\n" ... "n. yes|no\\n".
- P(yes) (``LLMConfig.logprobs``): a logits processor records, at every generated position, the log
  probabilities of the yes/no tokens ("yes", " yes", "Yes", ...; before the grammar masks anything), so
  no ``logits_all`` buffer (n_ctx x vocabulary floats) is needed.
- Build: ``python -m cqg_ray.llm.install`` compiles llama-cpp-python for this CPU (flags from
  /proc/cpuinfo, ``GGML_NATIVE=OFF``, AMX off) and caches the wheel per CPU feature set. A default
  (``GGML_NATIVE=ON``) build crashes at the first decode on CPUs with AMX (ggml's AMX matmul, reached
  through the "extra buffer types"); so on a CPU with AMX the model is also loaded with
  ``use_extra_bufts=False``, which avoids that path whatever the build (same speed, per ENVIRONMENT.md).
- Consecutive prompts sharing a prefix reuse llama.cpp's KV cache for that prefix (llama-cpp-python keeps
  the previous prompt's tokens), which is why the runner sorts requests by prompt.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Iterator, Sequence

from cqg_ray.config import LLMConfig
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, answer_gbnf
from cqg_ray.llm.bundled import resolve_model
from cqg_ray.llm.parse import p_yes_from_tokens

INSTALL_HINT = "python -m cqg_ray.llm.install   (builds llama-cpp-python[server]==0.3.36 for this CPU, cached)"
YES_NO_WORDS = ("yes", " yes", "Yes", " Yes", "YES", " YES", "no", " no", "No", " No", "NO", " NO")


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_tile" in f.read()
    except OSError:
        return False


@contextlib.contextmanager
def _without_extra_bufts():
    """Load a model with ``use_extra_bufts=False`` (the AMX crash workaround)."""
    import llama_cpp.llama_cpp as lc  # noqa: PLC0415

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
        import numpy as np  # noqa: PLC0415

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


class LlamaCppBackend(Backend):
    name = "llamacpp"
    batch_size = 1

    def __init__(self, llm: LLMConfig, n_threads: int | None = None):
        super().__init__(llm)
        try:
            from llama_cpp import Llama  # noqa: PLC0415
        except ImportError:
            raise BackendError(f"llama-cpp-python is not installed; install it with:\n  {INSTALL_HINT}") from None
        cfg = llm.llamacpp
        self.model_path = resolve_model(cfg.model, cfg.cache_dir)
        self.n_threads = n_threads or cfg.n_threads or available_cpus()
        guard = _without_extra_bufts() if cpu_has_amx() else contextlib.nullcontext()
        with guard:
            self.model = Llama(
                model_path=str(self.model_path),
                n_ctx=cfg.n_ctx,
                n_batch=cfg.n_batch,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                seed=0,
                verbose=False,
            )
        self._grammars: dict[int, Any] = {}
        self._yes_no_ids: dict[int, str] | None = None

    def grammar(self, n: int):
        from llama_cpp import LlamaGrammar  # noqa: PLC0415

        if n not in self._grammars:
            self._grammars[n] = LlamaGrammar.from_string(answer_gbnf(n), verbose=False)
        return self._grammars[n]

    def yes_no_ids(self) -> dict[int, str]:
        """Token id -> text for the single-token spellings of yes/no in this model's vocabulary."""
        if self._yes_no_ids is None:
            ids: dict[int, str] = {}
            for word in YES_NO_WORDS:
                toks = self.model.tokenize(word.encode(), add_bos=False, special=False)
                if len(toks) == 1:
                    ids[toks[0]] = word
            self._yes_no_ids = ids
        return self._yes_no_ids

    def complete_one(self, req: Request) -> Completion:
        from llama_cpp import LogitsProcessorList  # noqa: PLC0415

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
        if self.llm.logprobs and req.n_answers is not None:
            recorder = YesNoRecorder(self.yes_no_ids())
            kwargs["logits_processor"] = LogitsProcessorList([recorder])
        try:
            out = self.model.create_chat_completion(**kwargs)
        except ValueError as e:  # e.g. the prompt does not fit in n_ctx
            return Completion("", error=f"llama.cpp: {e}")
        text = out["choices"][0]["message"].get("content") or ""
        usage = out.get("usage") or {}
        p_yes = None
        if recorder is not None and recorder.steps:
            p_yes = p_yes_from_tokens(self._recorded_tokens(recorder), req.n_answers)  # type: ignore[arg-type]
        return Completion(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), p_yes)

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
        return [self.complete_one(r) for r in requests]

    def close(self) -> None:
        model = getattr(self, "model", None)
        if model is not None:
            model.close()
            self.model = None


class _Worker:
    """A Ray actor holding one model."""

    def __init__(self, llm: LLMConfig, n_threads: int | None):
        threads = n_threads or available_cpus()
        self.backend = LlamaCppBackend(llm, n_threads=threads)

    def complete(self, requests: list[Request]) -> list[Completion]:
        return self.backend.complete(requests)

    def ready(self) -> str:
        return str(self.backend.model_path)


class LlamaCppActorPool(Backend):
    """``llamacpp.num_actors`` Ray actors, each with its own model; requests go out in contiguous chunks
    (so prompts sharing a prefix stay on one actor), at most two chunks queued per actor."""

    name = "llamacpp"

    def __init__(self, llm: LLMConfig, chunk_size: int = 4, num_cpus_per_actor: float = 1.0):
        super().__init__(llm)
        import ray  # noqa: PLC0415

        cfg = llm.llamacpp
        if not ray.is_initialized():
            raise BackendError("LlamaCppActorPool needs a running Ray (ray.init()); use LlamaCppBackend in-process otherwise")
        n_threads = cfg.n_threads or max(1, available_cpus() // cfg.num_actors)
        Worker = ray.remote(num_cpus=num_cpus_per_actor)(_Worker)
        self.actors = [Worker.remote(llm, n_threads) for _ in range(cfg.num_actors)]
        self.chunk_size = chunk_size
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except Exception:
            self.close()
            raise

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        import ray  # noqa: PLC0415

        chunks = [list(range(s, min(s + self.chunk_size, len(requests)))) for s in range(0, len(requests), self.chunk_size)]
        next_chunk = 0
        inflight: dict[Any, tuple[Any, list[int]]] = {}

        def submit(actor) -> None:
            nonlocal next_chunk
            if next_chunk < len(chunks):
                idx = chunks[next_chunk]
                next_chunk += 1
                inflight[actor.complete.remote([requests[i] for i in idx])] = (actor, idx)

        for _ in range(2):
            for a in self.actors:
                submit(a)
        try:
            while inflight:
                ready, _ = ray.wait(list(inflight), num_returns=1)
                actor, idx = inflight.pop(ready[0])
                outs = ray.get(ready[0])
                submit(actor)
                yield from zip(idx, outs)
        finally:
            for ref in inflight:
                ray.cancel(ref)

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        for i, c in self.stream(requests):
            out[i] = c
        return out  # type: ignore[return-value]

    def close(self) -> None:
        import ray  # noqa: PLC0415

        for a in getattr(self, "actors", []):
            ray.kill(a)
        self.actors = []
