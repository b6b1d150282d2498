"""The serving logic, free of HTTP: the limits on texts, dynamic batching, and the answers of every route.

`EmbeddingService` holds one `InterpretableEmbedder`. Each text of each request becomes one item of a
`BatchQueue`, so `max_batch_size` counts texts: concurrent requests share encoder calls, and a request with many
texts is cut into batches. The encoder runs in a worker thread, so the replica keeps accepting (and rejecting)
requests while a batch computes. Only probabilities p = sigma(C(Enc(t))) come out of a batch; each request applies
its budget (the model's, or its own k or tau, through `InterpretableEmbedder.apply`) and output format afterwards.

`cqg_ray.serve.app` puts it behind the FastAPI routes, one instance per Serve replica.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from cqg_ray.config import ServeConfig
from cqg_ray.texts import BLANK, blank, unicode_error
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.serve.protocol import (
    ApiError,
    EmbeddingObject,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ExplainRequest,
    ExplainResponse,
    Health,
    ModelCard,
    ModelList,
    QuestionInfo,
    QuestionsResponse,
    Usage,
)


def default_encoder_batch_size(model: InterpretableEmbedder, flags: set[str] | None = None) -> int:
    """Texts per encoder forward inside a served batch when the config leaves it open (`encoder_batch_size: null`),
    from measurements of the encoder alone (docs/serving.md): 64 on a GPU; on a CPU with AVX-512 32 for the exported
    backends (openvino, 1 thread, length-sorted real sentences: 102 texts/s at 8, 142 at 16, 162 at 32, 148 at 64; 2
    threads: 182, 252, 202, 212); on an AVX2-only CPU 8 for them (served batches of 32 arrival-order texts, sorted and cut
    into mini-batches of 4 / 8 / 16 / 32: 1.12 / 1.04 / 0.93 / 0.67x the texts/s of one text a call: padding costs more
    than calls there); and 8 for torch (its per-token cost grows with padding: 89 texts/s at 8, 58 at 32)."""
    from cqg_ray.encoder_export import EXPORTED
    from cqg_ray.hardware import cpu_flags

    if str(model.device).startswith("cuda"):
        return 64
    if getattr(model.encoder, "backend", None) not in EXPORTED:
        return 8
    return 32 if "avx512f" in (cpu_flags() if flags is None else flags) else 8


class EmbeddingService:
    """One model behind the routes: checks, the batch queue (items = texts), the yes-rate counters, the answers."""

    def __init__(self, model: InterpretableEmbedder, cfg: ServeConfig):
        self.model, self.cfg = model, cfg
        self.queue = BatchQueue(self.probabilities, cfg.max_batch_size, cfg.batch_wait_timeout_s)
        recs = model.question_records
        self.model_yes_rates = [float(q["yes_rate"]) for q in recs] if all(isinstance(q.get("yes_rate"), (int, float)) for q in recs) else None
        self.encoder_batch_size = cfg.encoder_batch_size or default_encoder_batch_size(model)
        self.yes_counts = np.zeros(model.m, dtype=np.int64)
        self.texts_seen = 0
        self.batches = 0

    # ------------------------------------------------------------------ batching
    def probabilities(self, texts: list[str]) -> np.ndarray:
        """(n, m) float32 probabilities, counted into the served yes-rates (the model's budget)."""
        p = self.model.encode(texts, output="probs", batch_size=self.encoder_batch_size, progress=False)
        self.yes_counts += self.model.apply(p)[0].sum(axis=0)
        self.texts_seen += len(texts)
        self.batches += 1
        return p

    async def probs(self, texts: list[str]) -> np.ndarray:
        rows = await asyncio.gather(*(self.queue.submit(t) for t in texts))
        return np.stack(rows)

    # ------------------------------------------------------------------ checks
    def check_texts(self, texts: list[str], field: str) -> None:
        if not texts:
            raise ApiError(422, f"{field} is empty: send at least one text", code="empty_input", param=field)
        if len(texts) > self.cfg.max_texts_per_request:
            raise ApiError(413, f"{field} has {len(texts)} texts; at most {self.cfg.max_texts_per_request} per request",
                           code="too_many_texts", param=field)
        for i, t in enumerate(texts):
            name = f"{field}[{i}]" if len(texts) > 1 or field == "texts" else field
            if blank(t):
                raise ApiError(422, f"{name} is {BLANK}", code="empty_text", param=name)
            if len(t) > self.cfg.max_chars_per_text:
                raise ApiError(413, f"{name} has {len(t)} characters; at most {self.cfg.max_chars_per_text}", code="text_too_long", param=name)
            if problem := unicode_error(t, name):
                raise ApiError(422, problem, code="invalid_text", param=name)

    def budget(self, tau: float | None = None, k: int | None = None):
        """The budget of one request: its tau or k, else the model's; a k over m is a 422."""
        if k is not None and k > self.model.m:
            raise ApiError(422, f"k must be from 1 to m={self.model.m}, got {k}", code="invalid_value", param="k")
        return self.model.budget_for(threshold=tau, k=k)

    # ------------------------------------------------------------------ routes
    def health(self) -> Health:
        return Health(model=self.cfg.model_name, m=self.model.m, tau=self.model.tau, budget=self.model.budget.name,
                      texts_seen=self.texts_seen, batches=self.batches)

    async def embed(self, req: EmbedRequest) -> EmbedResponse:
        self.check_texts(req.texts, "texts")
        budget = self.budget(req.tau, req.k)
        p = await self.probs(req.texts)
        shown = budget.name if req.output != "probs" else "none: every probability"  # probs: no budget chooses anything
        out = dict(model=self.cfg.model_name, m=self.model.m, tau=self.model.tau, budget=shown, output=req.output, packed=req.packed)
        if req.output == "probs":
            return EmbedResponse(**out, embeddings=[[round(float(v), 6) for v in row] for row in p])
        mask, values = self.model.apply(p, budget)
        if req.output == "sparse":
            idx = [np.flatnonzero(row)[np.argsort(-pr[row], kind="stable")] for row, pr in zip(mask, p)]
            return EmbedResponse(**out, indices=[i.tolist() for i in idx], values=[[round(float(v), 6) for v in vals[i]] for i, vals in zip(idx, values)])
        if req.packed:
            return EmbedResponse(**out, embeddings=[base64.b64encode(row.tobytes()).decode() for row in np.packbits(mask, axis=1)])
        return EmbedResponse(**out, embeddings=mask.astype(int).tolist())

    async def explain(self, req: ExplainRequest) -> ExplainResponse:
        self.check_texts([req.text_a], "text_a")
        self.check_texts([req.text_b], "text_b")
        budget = self.budget(req.tau, req.k)
        p = await self.probs([req.text_a, req.text_b])
        return self.explanation(p[0], p[1], budget)

    def explanation(self, p_a: np.ndarray, p_b: np.ndarray, budget=None) -> ExplainResponse:
        """The questions active for both (cognitive load), ranked, the ones active for one, and the cosine."""
        return ExplainResponse(m=self.model.m, **self.model.explanation(p_a, p_b, budget).to_dict())

    def questions(self) -> QuestionsResponse:
        if self.model_yes_rates is not None:
            rates, source = self.model_yes_rates, "model"
        else:
            rates = [float(c) / self.texts_seen if self.texts_seen else None for c in self.yes_counts]
            source = "served"
        qs = [QuestionInfo(index=i, id=str(q.get("id", i)), text=q["text"], yes_rate=r, precision=q.get("precision"), recall=q.get("recall"),
                           n_heldout=q.get("n_heldout"))
              for i, (q, r) in enumerate(zip(self.model.question_records, rates))]
        return QuestionsResponse(model=self.cfg.model_name, m=self.model.m, tau=self.model.tau, budget=self.model.budget.name, yes_rate_source=source,
                                 texts_seen=self.texts_seen, questions=qs)

    def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self.cfg.model_name)])

    def count_tokens(self, texts: list[str]) -> int:
        """Encoder tokens of `texts` (the `usage` of /v1/embeddings), counted on the event loop (`Encoder.count_tokens`
        is safe beside a batch encoding in the worker thread)."""
        return self.model.encoder.count_tokens(texts)

    async def openai_embeddings(self, req: EmbeddingsRequest) -> EmbeddingsResponse:
        if req.model != self.cfg.model_name:
            raise ApiError(404, f"model {req.model!r} does not exist here; this server serves {self.cfg.model_name!r}",
                           code="model_not_found", param="model")
        if req.dimensions is not None and req.dimensions != self.model.m:
            raise ApiError(422, f"dimensions must be {self.model.m} (the number of questions) or left out, got {req.dimensions}",
                           code="invalid_value", param="dimensions")
        texts = [req.input] if isinstance(req.input, str) else req.input
        self.check_texts(texts, "input")
        p = await self.probs(texts)
        vectors = self.model.apply(p)[1]
        if req.encoding_format == "base64":
            data = [EmbeddingObject(index=i, embedding=base64.b64encode(v.astype("<f4").tobytes()).decode()) for i, v in enumerate(vectors)]
        else:
            data = [EmbeddingObject(index=i, embedding=v.tolist()) for i, v in enumerate(vectors)]
        tokens = self.count_tokens(texts)
        return EmbeddingsResponse(data=data, model=self.cfg.model_name, usage=Usage(prompt_tokens=tokens, total_tokens=tokens))


class BatchQueue:
    """Items from concurrent callers, run through ``fn`` (a list of items -> a sequence of as many results) on a worker
    thread, a batch at a time. A batch starts when the one before it has ended and takes every item waiting, up to
    `max_batch_size`; it waits for more only until its oldest item has waited `wait_s`. So under load each batch
    takes all that arrived while the one before it ran. (Ray Serve's `@serve.batch` closes a batch `wait_s` after it
    opens, whether or not the one before still runs: on 2 cores with 64 clients its batches queued one behind another,
    5.5-5.7 texts each, bench/serve.py.) A caller that went away before its batch starts is left out of it; an error
    in ``fn`` goes to every caller of that batch. The worker is a task of the submitting event loop that ends when
    nothing waits (a new loop starts afresh)."""

    def __init__(self, fn: Callable[[list], Any], max_batch_size: int, wait_s: float):
        self.fn, self.max_batch_size, self.wait_s = fn, max_batch_size, wait_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.worker: asyncio.Task | None = None

    async def submit(self, item):
        """The result of ``fn`` for ``item``, once its batch has run."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop, self.waiting, self.arrived, self.worker = loop, deque(), asyncio.Event(), None
        future = loop.create_future()
        self.waiting.append((item, time.monotonic(), future))
        self.arrived.set()
        if self.worker is None or self.worker.done():
            self.worker = loop.create_task(self.run())
        return await future

    async def next_batch(self) -> list:
        """The items of the next batch (at least one waits when this is called)."""
        batch, deadline = [], self.waiting[0][1] + self.wait_s
        while True:
            while self.waiting and len(batch) < self.max_batch_size:
                batch.append(self.waiting.popleft())
            left = deadline - time.monotonic()
            if len(batch) >= self.max_batch_size or left <= 0:
                return batch
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                pass

    async def run(self) -> None:
        while self.waiting:
            batch = [b for b in await self.next_batch() if not b[2].done()]  # done: the caller went away
            if not batch:
                continue
            try:
                results, error = await asyncio.to_thread(self.fn, [item for item, _, _ in batch]), None
            except Exception as e:
                results, error = None, e
            for i, (_, _, future) in enumerate(batch):
                if future.done():
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(results[i])
