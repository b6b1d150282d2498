"""The backend that ``LLMConfig.backend`` names.

    backend = make_backend(cfg.llm)          # llamacpp | openai | vllm | fake
"""

from __future__ import annotations

from cqg_ray.config import LLMConfig, RayConfig
from cqg_ray.llm.base import Backend
from cqg_ray.llm.fake import FakeBackend
from cqg_ray.llm.llamacpp import LlamaCppActorPool, LlamaCppBackend
from cqg_ray.llm.openai import OpenAIBackend
from cqg_ray.llm.vllm import VLLMBackend


def make_backend(llm: LLMConfig, *, in_process: bool | None = None, cluster: RayConfig | None = None) -> Backend:
    """The backend named by ``llm.backend``; ``cluster`` (the ray section) bounds vLLM's engine pool by its declared
    resources (`vllm.engine_concurrency`).

    For ``llamacpp``: Ray actors (``llm.llamacpp.num_actors``, one model each) when Ray is initialised or
    ``in_process=False``; the model in this process when Ray is not running or ``in_process=True``.
    """
    if llm.backend == "fake":
        return FakeBackend(llm)
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
