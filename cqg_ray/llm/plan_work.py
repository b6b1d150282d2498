"""The worker side of a streaming LLM stage (``cqg_ray.llm.stream`` is the driver's): a stage's ``PlanJob`` and the
``PlanWorker`` that runs its passes over the plan's row groups, one group per call.

    count      how many of the batch's requests the ledger holds (a resume's log line; nothing sent)
    answer     sends the ones it lacks through the engine (``runner.answer_pending``: the runner's retry rules) and
               writes the rows into the ledger itself (``BatchWriter``: journal + large shards)
    assemble   looks the batch's keys up in the ledger (``ledger.KeyIndex``) and hands the results to the job, which
               writes its parts (``<stage>/parts/<kind>-<group>-<id>.parquet``)

``ShardTexts`` reads a batch's texts from the corpus shards by row group; ``job_row``, ``_PendingRows`` and
``_LedgerRows`` are the request rows and the actors of the one-job answer pass (vLLM).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray import progress
from cqg_ray.config import LLMConfig, PipelineConfig
from cqg_ray.llm.base import p_yes_read
from cqg_ray.llm.ledger import KeyIndex, Ledger, request_key, worker_journal

PARTS = "parts"  # under the stage folder: the assemble pass's Parquet parts
RESULT_COLUMNS = ["key", "ok", "text", "error", "answers", "p_yes", "prompt_tokens", "completion_tokens", "attempts"]


class ShardTexts:
    """Texts by (shard, row) from the corpus shards, reading only the row groups that hold them (the last call's kept)."""

    def __init__(self, run):
        self.run, self.paths = run, None  # listed on first use: a job whose plan holds its own texts never needs them
        self.files: dict[int, tuple[pq.ParquetFile, np.ndarray]] = {}
        self.held: dict[tuple[int, int], pa.ChunkedArray] = {}

    def _file(self, s: int) -> tuple[pq.ParquetFile, np.ndarray]:
        if self.paths is None:
            from cqg_ray.artifacts import corpus_shards

            self.paths = corpus_shards(self.run)
        if s not in self.files:
            f = pq.ParquetFile(self.paths[s], filesystem=self.run.fs)
            md = f.metadata
            self.files[s] = (f, np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)]))
        return self.files[s]

    def get(self, shard: np.ndarray, row: np.ndarray) -> list[str]:
        out: list[str] = [""] * len(shard)
        shard, row = np.asarray(shard), np.asarray(row, dtype=np.int64)
        held = {}
        for s in np.unique(shard):
            f, starts = self._file(int(s))
            at = np.flatnonzero(shard == s)
            rg = np.searchsorted(starts, row[at], side="right") - 1
            for g in np.unique(rg):
                key = (int(s), int(g))
                col = self.held.get(key)
                if col is None:
                    col = f.read_row_group(int(g), columns=["text"]).column("text")
                held[key] = col
                sel = at[rg == g]
                for i, t in zip(sel, col.take(pa.array(row[sel] - starts[g])).to_pylist()):
                    out[i] = t
        self.held = held
        return out


class PlanJob:
    """A stage's part of a streaming LLM stage: ``requests`` of a row group of ``plan`` and ``assemble`` of their results.

    Made in the driver, pickled to the workers: keep ``__init__`` light and load in ``open`` (called once per worker,
    with the backend the worker answers with, or None)."""

    plan: str = "plan/plan.parquet"  # under the stage folder
    parts: dict[str, pa.Schema] = {}  # the part kinds ``assemble`` writes, and their schemas

    def __init__(self, run_root: str, stage: str, ledger: str, cfg: PipelineConfig, llm: LLMConfig | None = None):
        self.run_root, self.stage, self.ledger, self.cfg = run_root, stage, ledger, cfg
        self.llm = llm or cfg.llm

    def open(self, backend: Any) -> None:
        from cqg_ray.llm.backends import stage_budget
        from cqg_ray.llm.fit import PromptFitter
        from cqg_ray.rundir import RunDir

        self.run = RunDir(self.run_root)
        self.texts = ShardTexts(self.run)
        self.fitter = PromptFitter(stage_budget(self.llm, backend), self.ledger)

    def read(self, group: int) -> pa.Table:
        return pq.ParquetFile(self.run.path(self.stage, self.plan), filesystem=self.run.fs).read_row_group(group)

    def fit_counts(self) -> dict[str, int]:
        c, self.fitter.counts = self.fitter.counts, {k: 0 for k in self.fitter.counts}
        return c

    def write_part(self, kind: str, group: int, table: pa.Table) -> None:
        self.run.write_table(f"{self.stage}/{PARTS}/{kind}-{group:09d}-{uuid.uuid4().hex[:6]}.parquet", table)

    def requests(self, group: int) -> tuple[list, pa.Table]:
        """The requests of row group ``group`` and the group's plan rows."""
        raise NotImplementedError

    def assemble(self, group: int, reqs: list, results: list[dict | None], plan: pa.Table) -> dict[str, Any]:
        """Write the group's parts from its requests' ledger rows (None: not answered); return counters."""
        raise NotImplementedError


class PlanWorker:
    """Counts, answers and assembles batches of a job's plan (one per Ray Data actor, or one in-process).

    ``engine`` makes the backend on first use (a worker that only counts or assembles never loads a model);
    ``index`` is the ledger's ``KeyIndex`` (or a Ray object reference to one, fetched here, shared memory)."""

    def __init__(self, job: PlanJob, identity: dict, index: Any = None, engine: Callable[[], Any] | None = None, backend: Any = None,
                 retry_failed: bool = False):
        if index is not None and not isinstance(index, KeyIndex):
            import ray

            index = ray.get(index)
        self.job, self.identity, self.index = job, identity, index
        self.engine, self.backend, self.retry = engine, backend, retry_failed or job.llm.retry_failed
        self.owns_backend = backend is None
        self.writer: Any = None
        self.opened = False
        self._result_shard: tuple[int, pa.Table] | None = None

    def requests(self, group: int) -> tuple[list, list[str], pa.Table]:
        if not self.opened:
            self.job.open(self.backend)
            self.opened = True
        reqs, plan = self.job.requests(group)
        return reqs, [request_key(self.identity, r, self.job.llm.logprobs) for r in reqs], plan

    def _done(self, keys: list[str]) -> np.ndarray:
        if self.index is None or not len(self.index):
            return np.zeros(len(keys), dtype=bool)
        pos = self.index.find(keys)
        return (pos >= 0) & (self.index.ok[np.maximum(pos, 0)] | (not self.retry))

    def count(self, group: int) -> dict[str, Any]:
        reqs, keys, _ = self.requests(group)
        done = self._done(keys)
        unique = len(set(keys))
        unsent = {k: r for k, r, d in zip(keys, reqs, done) if not d}  # each key once
        return {"requests": len(reqs), "unique": unique, "from_ledger": unique - len(unsent), "to_send": len(unsent),
                "expected_tokens": sum(r.expected_tokens for r in unsent.values()), "fit": self.job.fit_counts()}

    def _missing(self, group: int) -> tuple[list, list[str], dict[str, Any]]:
        """The batch's requests, their keys, and {key: request} of those the ledger lacks (each key once, plan order)."""
        reqs, keys, _ = self.requests(group)
        self.job.fit_counts()
        todo: dict[str, Any] = {}
        for k, r, d in zip(keys, reqs, self._done(keys)):
            if not d and k not in todo:
                todo[k] = r
        return reqs, keys, todo

    def answer(self, group: int) -> dict[str, Any]:
        from cqg_ray.llm.backends import make_backend
        from cqg_ray.llm.ledger import BatchWriter
        from cqg_ray.llm.runner import _Pending, _prefix_order, answer_pending, new_run_stats

        t0 = time.time()
        reqs, keys, todo = self._missing(group)
        counters = new_run_stats(t0, len(reqs), len(set(keys)), len(set(keys)) - len(todo), len(todo))
        llm = self.job.llm
        if todo:
            if self.backend is None:
                self.backend = self.engine() if self.engine is not None else make_backend(llm, in_process=True, cluster=self.job.cfg.ray)
            if self.writer is None:
                self.writer = BatchWriter(Ledger(self.job.run, self.job.ledger, journal=worker_journal()), llm.flush_every, llm.flush_s)
            pending = sorted((_Pending(k, r) for k, r in todo.items()), key=lambda p: _prefix_order(p.request))
            answer_pending(pending, self.backend, llm, self.job.ledger, self.writer.add, counters)
        counters["shards"] = self.writer.shards if self.writer is not None else 0
        counters["wall_s"] = round(time.time() - t0, 3)
        return counters

    def pending_rows(self, group: int, attempt: int) -> list[dict[str, Any]]:
        """The batch's requests the ledger lacks as one-job rows (``job_row``), prefix order, at ``attempt``'s sampling."""
        from cqg_ray.llm.runner import _prefix_order

        _, _, todo = self._missing(group)
        return [job_row(k, r, self.job.llm, attempt) for k, r in sorted(todo.items(), key=lambda kr: _prefix_order(kr[1]))]

    def close(self) -> None:
        """Write what is buffered as a shard (an in-process run; Ray workers leave it in their journal for ``recover``)."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.ledger.close()
        if self.backend is not None and self.owns_backend:
            self.backend.close()

    def _results(self, pos: np.ndarray) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = [None] * len(pos)
        assert self.index is not None
        shard = np.where(pos >= 0, self.index.shard[np.maximum(pos, 0)], -1)
        ledger = Ledger(self.job.run, self.job.ledger)
        for s in np.unique(shard[shard >= 0]):
            if self._result_shard is None or self._result_shard[0] != s:
                path = self.job.run.path(ledger.folder, self.index.shards[int(s)])
                self._result_shard = (int(s), pq.read_table(path, columns=RESULT_COLUMNS, filesystem=self.job.run.fs))
            at = np.flatnonzero(shard == s)
            rows = self._result_shard[1].take(pa.array(self.index.row[pos[at]])).to_pylist()
            for i, r in zip(at, rows):
                out[i] = r
        return out

    def assemble(self, group: int) -> dict[str, Any]:
        """The job's parts of the batch from the ledger; its counters, ``missing`` (requests without a row) and ``fit``."""
        reqs, keys, plan = self.requests(group)
        fit = self.job.fit_counts()
        results = self._results(self.index.find(keys) if self.index is not None else np.full(len(keys), -1))
        missing = sum(r is None for r in results)
        return {**self.job.assemble(group, reqs, results, plan), "missing": missing, "fit": fit}


def job_row(key: str, req, llm: LLMConfig, attempt: int) -> dict[str, Any]:
    """A request as a row of a one-job pipeline: key, the request as JSON (meta left out), p_yes_read (``base.p_yes_read``:
    how its reply's P(yes) is read). Attempts after the first sample as the runner's retries do (``RETRY_TEMPERATURE``, seed = attempt)."""
    import dataclasses

    from cqg_ray.llm.runner import RETRY_TEMPERATURE

    if attempt > 1:
        req = dataclasses.replace(req, temperature=max(llm.temperature, RETRY_TEMPERATURE), seed=attempt)
    fields = {k: v for k, v in dataclasses.asdict(req).items() if k != "meta"}
    return {"key": key, "request_json": json.dumps(fields), "p_yes_read": p_yes_read(llm, req)}


class _PendingRows:
    """Ray Data actor: plan row groups -> the one-job rows of their requests the ledger lacks."""

    def __init__(self, job: PlanJob, identity: dict, index, attempt: int):
        self.worker, self.attempt = PlanWorker(job, identity, index=index), attempt

    def __call__(self, batch: dict) -> dict:
        rows = [r for g in batch["group"] for r in self.worker.pending_rows(int(g), self.attempt)]
        return {k: np.array([r[k] for r in rows], dtype=object if k != "p_yes_read" else np.int64) for k in ("key", "request_json", "p_yes_read")}


class _LedgerRows:
    """Ray Data actor: completion rows (``Backend.job``'s output) judged by the runner's rules and written into the
    ledger (``BatchWriter``, a journal per actor); a row that failed with attempts left is not written (asked again)."""

    def __init__(self, job: PlanJob, attempt: int):
        from cqg_ray.llm.ledger import BatchWriter
        from cqg_ray.rundir import RunDir

        self.job, self.attempt, llm = job, attempt, job.llm
        self.writer = BatchWriter(Ledger(RunDir(job.run_root), job.ledger, journal=worker_journal()), llm.flush_every, llm.flush_s)

    def __call__(self, batch: dict) -> dict:
        from cqg_ray.llm.base import Completion, request_of
        from cqg_ray.llm.runner import _finish, _Pending, judge, settled

        c = {"sent": 0, "finished": 0, "failures": 0, "again": 0, "prompt_tokens": 0, "completion_tokens": 0}
        for i in range(len(batch["key"])):
            row = {k: v[i] for k, v in batch.items()}
            req = request_of(row)
            err = row.get("error") or ""
            done = Completion(row.get("text") or "", int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0),
                              json.loads(row.get("p_yes_json") or "null"), error=err or None)
            ok, answers, error = judge(req, done)
            c["sent"] += 1
            c["prompt_tokens"] += done.prompt_tokens
            c["completion_tokens"] += done.completion_tokens
            if settled(req, done, ok, self.attempt, self.job.llm.max_attempts):
                p = _Pending(str(row["key"]), req, attempts=self.attempt, prompt_tokens=done.prompt_tokens,
                             completion_tokens=done.completion_tokens, text=done.text, error=error)
                self.writer.add(_finish(p, ok, answers, done.p_yes if ok else None))
                c["finished"] += 1
                c["failures"] += 0 if ok else 1
            else:
                c["again"] += 1
        return {"out": np.array([json.dumps(c)])}


def one_pass(worker: PlanWorker, mode: str, group: int) -> dict[str, Any]:
    """``worker``'s ``mode`` pass (count, answer or assemble) over one row group: its counters with the group."""
    return {"group": group, **getattr(worker, mode)(group)}


def pass_group(mode: str, job: PlanJob, identity: dict, index, group: int) -> str:
    """One count or assemble pass over one plan row group (a Ray task), as JSON as `_PassActor` returns it."""
    worker = PlanWorker(job, identity, index=index)
    try:
        return json.dumps(one_pass(worker, mode, group))
    finally:
        worker.close()


class _PassActor:
    """A Ray Data actor running one pass of ``PlanWorker`` over plan row groups (one group per call)."""

    def __init__(self, mode: str, job: PlanJob, identity: dict, index, engine, progress_queue=None):
        self.mode, self.worker = mode, PlanWorker(job, identity, index=index, engine=engine)
        progress.relay(progress_queue)  # the answer pass: requests finished and tokens, to the driver's view

    def __call__(self, batch: dict) -> dict:
        out = [json.dumps(one_pass(self.worker, self.mode, int(g))) for g in batch["group"]]
        progress.flush_relay()
        return {"out": np.array(out)}
