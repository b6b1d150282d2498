"""The one LLM interface: a request, a completion, a backend.

    backend = make_backend(cfg.llm)                       # cqg_ray.llm.backends: llamacpp | openai | vllm | fake
    outs = backend.complete([Request(answer_messages(text, qs), max_tokens=200, n_answers=len(qs))])
    outs[0].text, outs[0].prompt_tokens, outs[0].completion_tokens, outs[0].p_yes

Callers normally go through ``cqg_ray.llm.runner.run_requests``, which adds the ledger (resume, no repeated
calls), retries and accounting on top of a backend.

A request with ``n_answers`` set asks for exactly that many "i. yes|no" lines (the paper's packed A.3 mode); with
``LLMConfig.constrained`` the backend forces that format (a llama.cpp GBNF grammar, a vLLM structured-outputs
regex). A request with ``yes_no`` set is single-pass: no text is decoded; the backend reads P(yes) from the
yes/no tokens' logits at the first answer position and returns it as ``p_yes=[p]``. Sampling is
the config's (temperature 0 by default); a request may override temperature and seed (the runner does so
when it asks again after an unreadable answer).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from cqg_ray.config import LLMConfig, VLLMConfig, llm_identity
from cqg_ray.hardware import cpu_flags, pick_dtype

Message = dict[str, str]


class BackendError(RuntimeError):
    """A backend that cannot go on (misconfiguration, endpoint down after all retries, model missing)."""


@dataclass
class Request:
    """One chat completion to make. ``meta`` travels with it untouched and is not part of its identity."""

    messages: list[Message]
    max_tokens: int
    n_answers: int | None = None  # packed (A.3): the reply must be exactly n lines "i. yes|no"; the runner parses it
    yes_no: bool = False  # single-pass: P(yes) is read from the logits of the first answer position, nothing decoded
    answer_prefix: str = ""  # single-pass: the start of the reply, after which the answer token comes (e.g. "1.")
    meta: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None  # None = LLMConfig.temperature
    seed: int | None = None
    stop_on_loop: bool = False  # a question list: every engine stops decoding it once it loops (``parse.loops``)

    @property
    def expected_tokens(self) -> float:
        """Tokens it is expected to generate before any reply is seen (progress's estimate): none single-pass, half
        of ``max_tokens`` otherwise."""
        return 0.0 if self.yes_no else self.max_tokens / 2

    def validate(self) -> None:
        if not isinstance(self.messages, list) or not self.messages:
            raise ValueError("a request needs a non-empty list of chat messages")
        for m in self.messages:
            if not isinstance(m, dict) or set(m) != {"role", "content"} or not isinstance(m["content"], str):
                raise ValueError(f"a chat message is {{'role': ..., 'content': str}}, got {m!r:.120}")
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown chat role {m['role']!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n_answers is not None and self.n_answers < 1:
            raise ValueError(f"n_answers must be >= 1 or None, got {self.n_answers}")
        if self.answer_prefix and not self.yes_no:
            raise ValueError("answer_prefix applies to single-pass (yes_no) requests only")
        if self.yes_no and self.n_answers is not None:
            raise ValueError("a request is either single-pass (yes_no) or packed (n_answers), not both")


def p_yes_read(llm: LLMConfig, req: Request) -> int:
    """How an engine's rows say to read a reply's P(yes) (their ``p_yes_read`` column): 0 single-pass (the first
    position's top logprobs), n the n packed answer lines (when ``llm.logprobs``), -1 none."""
    if req.yes_no:
        return 0
    return req.n_answers if llm.logprobs and req.n_answers is not None else -1


def request_of(row: dict[str, Any]) -> Request:
    """The Request of a one-job row (``cqg_ray.llm.plan_work.job_row``: the request's fields as JSON in ``request_json``)."""
    import json

    return Request(**json.loads(row["request_json"]))


@dataclass
class Completion:
    """A backend's reply to one request. ``error`` is set (and ``text`` may be empty) when this one request failed."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    p_yes: list[float | None] | None = None  # P(yes) per answer line (packed, with logprobs) or [P(yes)] (single-pass)
    error: str | None = None
    final: bool = False  # asking again cannot help (e.g. the server refused this prompt with a 4xx)
    cached_tokens: int = 0  # prompt tokens served from a shared prefix / prefix cache instead of computed


def answer_gbnf(n: int) -> str:
    """GBNF grammar (llama.cpp) for exactly n lines "1. yes|no\\n" ... "n. yes|no\\n"."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    lines = " ".join(f'"{i}. " yn "\\n"' for i in range(1, n + 1))
    return f'root ::= {lines}\nyn ::= "yes" | "no"\n'


def answer_regex(n: int) -> str:
    """Regex (vLLM structured outputs) for exactly n lines "i. yes|no\\n", numbered 1..n.

    Stricter than ``(\\d+\\. (yes|no)\\n){n}``: the numbers themselves are fixed, so a reply cannot skip or repeat one.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return "".join(f"{i}\\. (yes|no)\\n" for i in range(1, n + 1))


IDENTITY_ENGINE_KWARGS = ("dtype", "quantization", "kv_cache_dtype", "tokenizer", "revision")


def vllm_dtype(cfg: VLLMConfig, flags: set[str] | None = None) -> str | None:
    """The dtype a vLLM engine is given (None: vLLM's ``auto``): ``engine_kwargs['dtype']``, else ``dtype`` unless
    ``auto``, else on ``cpu`` `pick_dtype` for this CPU (bfloat16 where native, float32 elsewhere)."""
    if "dtype" in cfg.engine_kwargs:
        return cfg.engine_kwargs["dtype"]
    if cfg.dtype != "auto":
        return cfg.dtype
    return pick_dtype(flags) if cfg.device == "cpu" else None


def file_fingerprint(path: str, chunk: int = 1 << 20) -> str:
    """Size + sha256 of a file's first and last MiB: tells two model files apart without reading gigabytes."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        if size > chunk:
            f.seek(max(chunk, size - chunk))
            h.update(f.read(chunk))
    return f"{size}:{h.hexdigest()[:32]}"


def llama_cpp_installed() -> bool:
    """Whether llama-cpp-python can be imported here (``scripts/setup.sh`` builds it only where it is needed or asked for)."""
    import importlib.util
    import sys

    if "llama_cpp" in sys.modules:  # None there: blocked (how the tests take it away)
        return sys.modules["llama_cpp"] is not None
    return importlib.util.find_spec("llama_cpp") is not None


def resolve_engine(name: str, flags: set[str] | None = None, work: str = "score", llama_cpp: bool | None = None) -> str:
    """``auto`` -> the measured fastest embedded engine installed, for this CPU and this kind of work (``score``:
    single-pass answers; ``generate``: batched greedy generation), docs/llm.md: torch-bfloat16 for both where bfloat16
    is native (AVX-512-BF16 or AMX); on other x86 CPUs with AVX2, torch-float32 scores (1.50x llama.cpp) and llama.cpp
    generates (torch-float32 is at par there, 1.05x, for 4x the memory); llama.cpp on anything else. Without
    llama-cpp-python (``llama_cpp``: installed or not, found here by default) torch-float32 takes llama.cpp's place."""
    if work not in ("score", "generate"):
        raise ValueError(f"work is score or generate, got {work!r}")
    if name != "auto":
        return name
    flags = cpu_flags() if flags is None else flags
    if pick_dtype(flags) == "bfloat16":
        return "torch-bfloat16"
    if not (llama_cpp_installed() if llama_cpp is None else llama_cpp):
        return "torch-float32"
    return "torch-float32" if work == "score" and "avx2" in flags else "llamacpp"


def backend_identity(llm: LLMConfig) -> dict[str, Any]:
    """What decides the replies, for the ledger's request keys: ``config.llm_identity`` plus what is backend-specific.

    Added only when it applies, so the keys of a plain config stay as they were: a GGUF given by path is keyed by
    its content (``file_fingerprint``; a bundled model's name already pins its sha256), the OpenAI ``extra_body``
    and whether a grammar / structured output is sent, and vLLM engine arguments that change the numbers.
    """
    ident = llm_identity(llm)
    if llm.backend == "llamacpp" and not llm.llamacpp.model.startswith("bundled:"):
        path = os.path.expanduser(llm.llamacpp.model)
        if os.path.isfile(path):
            ident["gguf"] = file_fingerprint(path)
    if llm.backend == "llamacpp":  # the engine that answers single-pass requests (request_key keeps it for those only)
        ident["score_engine"] = resolve_engine(llm.llamacpp.score_engine, work="score")
        gen = resolve_engine(llm.llamacpp.generate_engine, work="generate")
        if gen != "llamacpp":  # the engine that decodes generation requests (request_key keeps it for those only)
            ident["generate_engine"] = gen
    if llm.backend == "openai":
        if llm.openai.extra_body:
            ident["extra_body"] = llm.openai.extra_body
        if llm.constrained and (llm.openai.send_grammar or llm.openai.send_structured_outputs):
            ident["sends"] = {"grammar": llm.openai.send_grammar, "structured_outputs": llm.openai.send_structured_outputs}
    if llm.backend == "vllm":
        engine = {k: llm.vllm.engine_kwargs[k] for k in IDENTITY_ENGINE_KWARGS if k in llm.vllm.engine_kwargs}
        dtype = vllm_dtype(llm.vllm)
        if dtype is not None:
            engine["dtype"] = dtype
        if engine:
            ident["engine"] = engine
    return ident


def in_order(results: Iterable[tuple[int, Completion]], n: int) -> list[Completion]:
    """The completions of a ``stream`` (index, completion pairs in any order) as a list in request order."""
    out: list[Completion | None] = [None] * n
    for i, c in results:
        out[i] = c
    return out  # type: ignore[return-value]


class Backend:
    """Batched chat completions. Subclasses implement ``complete``; ``stream`` yields results as they finish."""

    name = "base"
    remote_engines = False  # True where the engines run in Ray actors (their progress counters come through a queue)
    batch_size = 8  # requests per ``complete`` call in the default ``stream``

    def __init__(self, llm: LLMConfig):
        self.llm = llm

    @property
    def identity(self) -> dict[str, Any]:
        """What decides the answers (part of every request key in the ledger)."""
        return backend_identity(self.llm)

    def temperature(self, req: Request) -> float:
        return self.llm.temperature if req.temperature is None else req.temperature

    def constrained(self, req: Request) -> bool:
        return self.llm.constrained and req.n_answers is not None

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        """One completion per request, in order."""
        raise NotImplementedError

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        """(index into ``requests``, completion) pairs as they finish, in any order. Default: ``complete`` in batches."""
        for start in range(0, len(requests), self.batch_size):
            for i, c in enumerate(self.complete(requests[start : start + self.batch_size])):
                yield start + i, c

    def job(self, ds: Any) -> Any:
        """A Ray Dataset of one-job rows (``cqg_ray.llm.plan_work.job_row``: key, request_json, p_yes_read) -> completion rows
        (those columns + text, prompt_tokens, completion_tokens, p_yes_json, error), for engines that run as a Ray Data
        stage of their own (vLLM's ``ray.data.llm`` processor). Other engines answer in the stream's actor pool."""
        raise NotImplementedError(f"{type(self).__name__} answers in the stream's actor pool, not as a Ray Data job")

    def prompt_budget(self) -> Any:
        """The engine's context and prompt-token counter (``cqg_ray.llm.fit.PromptBudget``; None when unknown). Each
        engine gives its own."""
        return None

    def counters(self) -> dict[str, int]:
        """Backend-level accounting beyond requests and tokens (e.g. HTTP retries), running totals."""
        return {}

    def close(self) -> None:
        pass

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

