"""The engines ``LLMConfig.backend`` names, and the prompt budget a stage checks its prompts against.

    backend = make_backend(cfg.llm)          # llamacpp | openai | vllm | fake
    budget = stage_budget(cfg.llm, backend)  # the backend's own, else the named engine's (None: context unknown)
    keep_backend(backend)                    # this process answers the stages asking for its identity (the demo)
"""

from __future__ import annotations

import functools
import json
from typing import Any

from cqg_ray.config import LLMConfig, RayConfig
from cqg_ray.llm.base import Backend
from cqg_ray.llm.engines.fake import FakeBackend, fake_budget
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend, llamacpp_budget
from cqg_ray.llm.engines.llamacpp_pool import LlamaCppActorPool
from cqg_ray.llm.engines.openai import OpenAIBackend, openai_budget
from cqg_ray.llm.engines.vllm import VLLMBackend, vllm_budget


def make_backend(llm: LLMConfig, *, in_process: bool | None = None, cluster: RayConfig | None = None) -> Backend:
    """The backend named by ``llm.backend``; ``cluster`` (the ray section) bounds vLLM's engine pool by its declared
    resources (`vllm.engine_concurrency`).

    For ``llamacpp``: Ray actors (``llm.llamacpp.num_actors``, one model each) when Ray is initialised or
    ``in_process=False``; the model in this process when Ray is not running or ``in_process=True``.
    """
    if llm.backend == "fake":
        return FakeBackend(llm, record=False)
    if llm.backend == "openai":
        return OpenAIBackend(llm)
    if llm.backend == "vllm":
        return VLLMBackend(llm, cluster)
    if llm.backend == "llamacpp":
        if in_process is None:
            import ray

            in_process = not ray.is_initialized()
        return LlamaCppBackend(llm) if in_process else LlamaCppActorPool(llm)
    raise ValueError(f"unknown LLM backend {llm.backend!r}")


# backends loaded in this process that the streaming stages answer with instead of Ray workers' own engines, by identity
_KEPT: dict[str, Any] = {}


def _identity_key(identity: dict) -> str:
    return json.dumps(identity, sort_keys=True, default=str)


def keep_backend(backend: Any) -> None:
    """Have the stages of this process answer with ``backend`` (loaded here) wherever they ask for its identity, in
    this process instead of a Ray actor pool of their own: on one machine, an engine loaded once serves every stage
    that uses it (the demo hands over the engines its rate measurement loaded). `release_backends` ends it."""
    _KEPT[_identity_key(backend.identity)] = backend


def kept_backend(identity: dict) -> Any:
    """The backend `keep_backend` kept for ``identity``; None where none is."""
    return _KEPT.get(_identity_key(identity))


def release_backends(identity: dict | None = None) -> None:
    """Close and forget the kept backend of ``identity`` (None: all of them)."""
    keys = list(_KEPT) if identity is None else [_identity_key(identity)]
    for k in keys:
        if (b := _KEPT.pop(k, None)) is not None:
            b.close()


BUDGETS = {"fake": fake_budget, "llamacpp": llamacpp_budget, "vllm": vllm_budget, "openai": openai_budget}
KEPT = ("llamacpp", "vllm")  # budgets read from local files (a tokenizer): built once per process and config


def prompt_budget(llm: LLMConfig) -> Any:
    """The budget (``cqg_ray.llm.fit.PromptBudget``) of the engine ``llm`` names; None: the context length is unknown,
    nothing can be checked. The embedded engine's and vLLM's are kept per process for the same config: each task or
    actor of a streaming stage asks for one, and loading a tokenizer takes seconds (an OpenAI-compatible server's is
    asked again: the server may have changed)."""
    if llm.backend not in BUDGETS:
        raise ValueError(f"unknown LLM backend {llm.backend!r}")
    if llm.backend in KEPT:
        return _kept_budget(llm.backend, llm.model_dump_json())
    return BUDGETS[llm.backend](llm)


@functools.lru_cache(maxsize=4)
def _kept_budget(backend: str, llm_json: str) -> Any:
    return BUDGETS[backend](LLMConfig.model_validate_json(llm_json))


def stage_budget(llm: LLMConfig, backend: Backend | None = None) -> Any:
    """The budget of the backend a stage was handed (tests, a warm engine), else of the engine ``llm`` names."""
    if backend is not None:
        return backend.prompt_budget()
    return prompt_budget(llm)
