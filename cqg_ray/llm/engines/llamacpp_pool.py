"""The embedded engine as Ray actors: ``llamacpp.num_actors`` actors, each a ``LlamaCppBackend`` with its own model.

    b = LlamaCppActorPool(LLMConfig())               # needs a running Ray; make_backend picks it when Ray is up
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.hardware import available_cpus
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, in_order
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend, batch_decoded, llamacpp_budget


class _Worker:
    """A Ray actor holding one model."""

    def __init__(self, llm: LLMConfig, n_threads: int | None):
        threads = n_threads or available_cpus()
        self.backend = LlamaCppBackend(llm, n_threads=threads)

    def stream(self, requests: list[Request], progress_queue: Any = None) -> Iterator[tuple[int, Completion]]:
        """(index in requests, completion) as each finishes: a Ray streaming generator, so the caller journals
        every result the moment it exists (a chunk of long generations is minutes of work). The engine's token
        counters go to ``progress_queue`` (the driver's progress view) as they advance."""
        progress.relay(progress_queue)
        for item in self.backend.stream(requests):
            yield item
        progress.flush_relay()

    def ready(self) -> str:
        return str(self.backend.model_path)


class LlamaCppActorPool(Backend):
    """``llamacpp.num_actors`` Ray actors, each with its own model; requests go out in contiguous chunks
    (so prompts sharing a prefix stay on one actor), at most two chunks queued per actor."""

    name = "llamacpp"
    remote_engines = True  # its engines run in Ray actors: a progress view drains what they relay

    def __init__(self, llm: LLMConfig, chunk_size: int = 4, num_cpus_per_actor: float = 1.0):
        super().__init__(llm)
        import ray

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

    def prompt_budget(self):
        return llamacpp_budget(self.llm)

    def chunks(self, requests: Sequence[Request]) -> list[list[int]]:
        """Consecutive runs of requests of one kind, cut to a size that keeps each actor's batching whole:
        four batches of single-pass prompts (``score_batch`` each: the questions about a text share its prefix), twice
        ``batch_generate`` greedy generations, ``chunk_size`` of anything else."""
        cfg = self.llm.llamacpp

        def kind(r: Request) -> tuple[str, int]:
            if r.yes_no:
                return "score", 4 * cfg.score_batch
            if batch_decoded(self.llm, r):
                return "generate", 2 * cfg.batch_generate
            return "one", self.chunk_size

        out: list[list[int]] = []
        last = None
        for i, r in enumerate(requests):
            k, size = kind(r)
            if k != last or len(out[-1]) >= size:
                out.append([])
            out[-1].append(i)
            last = k
        return out

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        import ray

        chunks = self.chunks(requests)
        next_chunk = 0
        inflight: dict[Any, tuple[Any, list[int]]] = {}

        def submit(actor) -> None:
            nonlocal next_chunk
            if next_chunk < len(chunks):
                idx = chunks[next_chunk]
                next_chunk += 1
                gen = actor.stream.options(num_returns="streaming").remote([requests[i] for i in idx], progress.queue())
                inflight[gen] = (actor, idx)

        for _ in range(2):
            for a in self.actors:
                submit(a)
        try:
            while inflight:
                ready, _ = ray.wait(list(inflight), num_returns=1)
                gen = ready[0]
                actor, idx = inflight[gen]
                try:
                    j, completion = ray.get(next(gen))
                except StopIteration:  # the chunk is done: the actor takes the next one
                    del inflight[gen]
                    submit(actor)
                    continue
                yield idx[j], completion
        finally:
            for gen in inflight:
                ray.cancel(gen)

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        return in_order(self.stream(requests), len(requests))

    def close(self) -> None:
        import ray

        for a in getattr(self, "actors", []):
            ray.kill(a)
        self.actors = []
