"""Streaming LLM stages: a plan in Parquet, workers that build, send and assemble its batches, a driver adding counters.

A stage writes its plan as Parquet (one row per prompt or per text, a row group per batch) and hands ``stream_plan``
a ``PlanJob``: the stage's own code that turns one row group into requests (``requests``) and answered requests into
output parts (``assemble``). ``PlanWorker`` runs three passes of a job over row groups, one group per call:

    count      how many of the batch's requests the ledger holds (a resume's log line; nothing sent)
    answer     sends the ones it lacks through the engine (``runner.answer_pending``: the runner's retry rules) and
               writes the rows into the ledger itself (``BatchWriter``: journal + large shards)
    assemble   looks the batch's keys up in the ledger (``KeyIndex``) and hands the results to the job, which writes
               its parts (``<stage>/parts/<kind>-<group>-<id>.parquet``), streamed into ``<stage>/<kind>.parquet`` at the end

On Ray the passes are Ray Data actor pools over the row groups (``RayPasses``; answering: an engine pool that grows
with the cluster, ``engine_pool``); without Ray, or with a backend handed in (tests, a warm engine), the same passes
run in this process (``LocalPasses``). The driver holds the plan's size and counters, never requests or results.
``KeyIndex`` is the ledger's key column, sorted, with where each key's row lies (shard, row): built once per pass in a
task, shared read-only with the workers through the object store.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray.config import LLMConfig, PipelineConfig
from cqg_ray.llm.ledger import Ledger, request_key, worker_journal
from cqg_ray.pools import declared, pool_range

log = logging.getLogger("cqg_ray")

PARTS = "parts"  # under the stage folder: the assemble pass's Parquet parts
SENT_COUNTERS = ("sent", "finished", "failures", "retries", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "shards")
RESULT_COLUMNS = ["key", "ok", "text", "error", "answers", "p_yes", "prompt_tokens", "completion_tokens", "attempts"]
FIT_COUNTS = ("checked", "clipped", "texts_dropped", "chars_cut")


def rows_per_group(pairs_per_row: float, pairs: int = 10_000) -> int:
    """Plan rows per row group (a batch): about ``pairs`` (text, question) pairs."""
    return max(1, int(pairs // max(pairs_per_row, 1)))


def add_counters(total: dict, part: dict) -> dict:
    """Sum two counter dicts (numbers, lists of numbers element-wise, nested dicts; ``max_tokens_before`` by max)."""
    for k, v in part.items():
        if isinstance(v, dict):
            total[k] = add_counters(total.get(k, {}), v)
        elif isinstance(v, list):
            have = total.get(k)
            total[k] = v if have is None else [a + b for a, b in zip(have, v)]
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            total[k] = v
        elif k == "max_tokens_before":
            total[k] = max(total.get(k, 0), v)
        else:
            total[k] = total.get(k, 0) + v
    return total


def fit_report(fit: dict) -> dict[str, int]:
    """A pass's summed fitter counts under the names a stage's manifest uses (as ``PromptFitter.report``)."""
    return {"prompts_checked": fit.get("checked", 0), "prompts_clipped": fit.get("clipped", 0), "texts_dropped": fit.get("texts_dropped", 0),
            "chars_cut": fit.get("chars_cut", 0), "longest_prompt_tokens": fit.get("max_tokens_before", 0)}


# ----------------------------------------------------------------------------------------- texts and plans


def corpus_places(run, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of each of ``doc_ids`` in the corpus shards; one shard's ids read at a time."""
    from cqg_ray.artifacts import ArtifactError, corpus_shards

    shard = np.full(len(doc_ids), -1, dtype=np.int32)
    row = np.zeros(len(doc_ids), dtype=np.int64)
    ids = pa.array(doc_ids, pa.string())
    for i, path in enumerate(corpus_shards(run)):
        mine = pq.read_table(path, columns=["doc_id"], filesystem=run.fs).column("doc_id").combine_chunks()
        pos = pc.index_in(mine, value_set=ids).to_numpy(zero_copy_only=False)
        found = ~np.isnan(pos.astype(float))
        at = pos[found].astype(np.int64)
        shard[at] = i
        row[at] = np.flatnonzero(found)
    if (shard < 0).any():
        raise ArtifactError(f"{int((shard < 0).sum())} documents are not in the corpus shards; redo `cqg-ray cluster`")
    return shard, row


class ShardTexts:
    """Texts by (shard, row) from the corpus shards, reading only the row groups that hold them (the last call's kept)."""

    def __init__(self, run):
        from cqg_ray.artifacts import corpus_shards

        self.run, self.paths = run, corpus_shards(run)
        self.files: dict[int, tuple[pq.ParquetFile, np.ndarray]] = {}
        self.held: dict[tuple[int, int], pa.ChunkedArray] = {}

    def _file(self, s: int) -> tuple[pq.ParquetFile, np.ndarray]:
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


def write_plan(run, path: str, table: pa.Table, rows: int) -> list[int]:
    """The plan at ``path`` (under the run), ``rows`` rows a row group; its row groups (the batches)."""
    import io

    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=max(1, rows))
    run.write_bytes(path, buf.getvalue())
    return list(range(pq.ParquetFile(run.path(path), filesystem=run.fs).num_row_groups)) if table.num_rows else []


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
        from cqg_ray.llm.fit import PromptFitter, stage_budget
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


# ----------------------------------------------------------------------------------------- the ledger's keys


@dataclass
class KeyIndex:
    """The ledger's keys, sorted (fixed 64-byte hex), each with its row's place (shard name, row) and ok flag."""

    keys: np.ndarray
    ok: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    shards: list[str]

    @classmethod
    def build(cls, ledger: Ledger) -> "KeyIndex":
        """From the shards' key and ok columns only (journals must be recovered first). The last copy of a key wins."""
        names = ledger.shards()
        keys, ok, shard, row = [], [], [], []
        for i, n in enumerate(names):
            t = pq.read_table(ledger.run.path(ledger.folder, n), columns=["key", "ok"], filesystem=ledger.run.fs)
            k = t.column("key").combine_chunks().cast(pa.binary(64))
            keys.append(np.frombuffer(k.buffers()[1], dtype="S64", count=len(k), offset=k.offset * 64) if len(k) else np.zeros(0, "S64"))
            ok.append(t.column("ok").combine_chunks().fill_null(False).to_numpy(zero_copy_only=False).astype(bool))
            shard.append(np.full(t.num_rows, i, dtype=np.int32))
            row.append(np.arange(t.num_rows, dtype=np.int64))
        if not names:
            return cls(np.zeros(0, "S64"), np.zeros(0, bool), np.zeros(0, np.int32), np.zeros(0, np.int64), [])
        k, o, s, r = (np.concatenate(x) for x in (keys, ok, shard, row))
        order = np.argsort(k, kind="stable")  # equal keys stay in shard (time) order: the last of each run wins
        k, o, s, r = k[order], o[order], s[order], r[order]
        last = np.r_[k[1:] != k[:-1], True]
        return cls(k[last], o[last], s[last], r[last], names)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, keys: list[str]) -> np.ndarray:
        """Position of each key in the index, -1 where the ledger lacks it."""
        q = np.array(keys, dtype="S64")
        if not len(self.keys):
            return np.full(len(q), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
        return np.where(self.keys[pos] == q, pos, -1)


def ledger_index(run_root: str, stage: str):
    """(KeyIndex, totals) of a ledger after moving killed writers' journals into a shard; and how many rows were recovered."""
    from cqg_ray.llm.ledger import latest, table_totals
    from cqg_ray.llm.runner import ACCOUNTING
    from cqg_ray.rundir import RunDir

    ledger = Ledger(RunDir(run_root), stage)
    recovered = ledger.recover()
    return KeyIndex.build(ledger), {**table_totals(latest(ledger.columns(ACCOUNTING))), "recovered": recovered}


# ----------------------------------------------------------------------------------------- the passes of one worker


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
        from_ledger = len({k for k, d in zip(keys, done) if d})
        return {"requests": len(reqs), "unique": unique, "from_ledger": from_ledger, "to_send": unique - from_ledger,
                "fit": self.job.fit_counts()}

    def answer(self, group: int) -> dict[str, Any]:
        from cqg_ray.llm.backends import make_backend
        from cqg_ray.llm.ledger import BatchWriter
        from cqg_ray.llm.runner import _Pending, _prefix_order, answer_pending, new_run_stats

        t0 = time.time()
        reqs, keys, _ = self.requests(group)
        self.job.fit_counts()
        done = self._done(keys)
        todo: dict[str, Any] = {}
        for k, r, d in zip(keys, reqs, done):
            if not d and k not in todo:
                todo[k] = _Pending(k, r)
        counters = new_run_stats(t0, len(reqs), len(set(keys)), len(set(keys)) - len(todo), len(todo))
        llm = self.job.llm
        if todo:
            if self.backend is None:
                self.backend = self.engine() if self.engine is not None else make_backend(llm, in_process=True, cluster=self.job.cfg.ray)
            if self.writer is None:
                self.writer = BatchWriter(Ledger(self.job.run, self.job.ledger, journal=worker_journal()), llm.flush_every, llm.flush_s)
            pending = sorted(todo.values(), key=lambda p: _prefix_order(p.request))
            answer_pending(pending, self.backend, llm, self.job.ledger, self.writer.add, counters)
        counters["shards"] = self.writer.shards if self.writer is not None else 0
        counters["wall_s"] = round(time.time() - t0, 3)
        return counters

    def pending_rows(self, group: int, attempt: int) -> list[dict[str, Any]]:
        """The batch's requests the ledger lacks as one-job rows (``job_row``), prefix order, at ``attempt``'s sampling."""
        from cqg_ray.llm.runner import _prefix_order

        reqs, keys, _ = self.requests(group)
        self.job.fit_counts()
        done = self._done(keys)
        todo: dict[str, Any] = {}
        for k, r, d in zip(keys, reqs, done):
            if not d and k not in todo:
                todo[k] = r
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


# ----------------------------------------------------------------------------------------- one Ray Data job (vLLM)


def job_row(key: str, req, llm: LLMConfig, attempt: int) -> dict[str, Any]:
    """A request as a row of a one-job pipeline: key, the request as JSON (meta left out), n_answers (0: single-pass,
    -1: free text). Attempts after the first sample as the runner's retries do (``RETRY_TEMPERATURE``, seed = attempt)."""
    import dataclasses

    from cqg_ray.llm.runner import RETRY_TEMPERATURE

    if attempt > 1:
        req = dataclasses.replace(req, temperature=max(llm.temperature, RETRY_TEMPERATURE), seed=attempt)
    fields = {k: v for k, v in dataclasses.asdict(req).items() if k != "meta"}
    return {"key": key, "request_json": json.dumps(fields), "n_answers": 0 if req.yes_no else req.n_answers if req.n_answers is not None else -1}


class _PendingRows:
    """Ray Data actor: plan row groups -> the one-job rows of their requests the ledger lacks."""

    def __init__(self, job: PlanJob, identity: dict, index, attempt: int):
        self.worker, self.attempt = PlanWorker(job, identity, index=index), attempt

    def __call__(self, batch: dict) -> dict:
        rows = [r for g in batch["group"] for r in self.worker.pending_rows(int(g), self.attempt)]
        return {k: np.array([r[k] for r in rows], dtype=object if k != "n_answers" else np.int64) for k in ("key", "request_json", "n_answers")}


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
        from cqg_ray.llm.runner import _finish, _Pending, judge

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
            if ok or self.attempt >= self.job.llm.max_attempts or (req.yes_no and not done.error):  # same prompt, same logits
                p = _Pending(str(row["key"]), req, attempts=self.attempt, prompt_tokens=done.prompt_tokens,
                             completion_tokens=done.completion_tokens, text=done.text, error=error)
                self.writer.add(_finish(p, ok, answers, done.p_yes if ok else None))
                c["finished"] += 1
                c["failures"] += 0 if ok else 1
            else:
                c["again"] += 1
        return {"out": np.array([json.dumps(c)])}


def answer_in_one_job(job: PlanJob, identity: dict, groups: list[int], index, backend, size: tuple[int, int], reindex) -> dict[str, Any]:
    """The answer pass as one Ray Data job per attempt: plan groups -> pending request rows (CPU actors) ->
    ``backend.job`` (vLLM: ``ray.data.llm``'s processor with its autoscaling engine pool) -> judged rows into the
    ledger (CPU actors). A row that failed with attempts left goes again in the next attempt's job, after
    ``reindex()`` (the journals into a shard, the keys again) tells the pending rows what is done."""
    import ray

    counters: dict[str, int] = {"sent": 0, "finished": 0, "failures": 0, "retries": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0,
                                "completion_tokens": 0, "shards": 0}
    for attempt in range(1, job.llm.max_attempts + 1):
        pool = ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, min(size[1], len(groups))))
        ds = ray.data.from_items([{"group": g} for g in groups], override_num_blocks=len(groups)).map_batches(
            _PendingRows, fn_constructor_kwargs={"job": job, "identity": identity, "index": index, "attempt": attempt},
            compute=pool, batch_size=1, num_cpus=1)
        ds = backend.job(ds).map_batches(_LedgerRows, fn_constructor_kwargs={"job": job, "attempt": attempt},
                                         compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, size[1])), num_cpus=1,
                                         batch_size=1024)
        c: dict = {}
        for r in ds.iter_rows():
            add_counters(c, json.loads(r["out"]))
        if attempt > 1:
            counters["retries"] += c.get("sent", 0)
        for k in ("sent", "finished", "failures", "prompt_tokens", "completion_tokens"):
            counters[k] += c.get(k, 0)
        index = reindex()
        if not c.get("again"):
            break
        log.info("llm %s: attempt %d for %d requests", job.ledger, attempt + 1, c["again"])
    return counters


# ----------------------------------------------------------------------------------------- the passes, mapped


def concat_parts(run_root: str, stage: str, kinds: dict[str, pa.Schema]) -> dict[str, int]:
    """``<stage>/<kind>.parquet`` from the assemble pass's parts, streamed one part at a time in name (group) order; parts removed."""
    from cqg_ray.rundir import RunDir

    run = RunDir(run_root)
    names = run.ls(stage, PARTS, suffix=".parquet") if run.exists(stage, PARTS) else []
    out = {}
    for kind, schema in kinds.items():
        parts = (pq.read_table(run.path(stage, PARTS, name), filesystem=run.fs) for name in sorted(names) if name.startswith(kind + "-"))
        out[kind] = run.write_tables(f"{stage}/{kind}.parquet", schema, parts)
    run.rm(stage, PARTS)
    return out


class LocalPasses:
    """The passes in this process, one batch after another (tests, a backend handed in, no Ray)."""

    def __init__(self, job: PlanJob, identity: dict, backend):
        self.job, self.identity, self.backend = job, identity, backend

    def index(self):
        return ledger_index(self.job.run_root, self.job.ledger)

    def map(self, mode: str, groups: list[int], index) -> Iterator[dict]:
        worker = PlanWorker(self.job, self.identity, index=index, backend=self.backend)
        try:
            for g in groups:
                yield {"group": g, **getattr(worker, mode)(g)}
        finally:
            worker.close()

    def answer(self, groups: list[int], index) -> dict[str, Any]:
        sent: dict = {}
        for part in self.map("answer", groups, index):
            add_counters(sent, {k: part[k] for k in SENT_COUNTERS})
        return sent

    def concat(self) -> dict[str, int]:
        return concat_parts(self.job.run_root, self.job.stage, self.job.parts)


class _PassActor:
    """A Ray Data actor running one pass of ``PlanWorker`` over plan row groups (one group per call)."""

    def __init__(self, mode: str, job: PlanJob, identity: dict, index, engine):
        self.mode, self.worker = mode, PlanWorker(job, identity, index=index, engine=engine)

    def __call__(self, batch: dict) -> dict:
        out = [json.dumps({"group": int(g), **getattr(self.worker, self.mode)(int(g))}) for g in batch["group"]]
        return {"out": np.array(out)}


def engine_pool(llm: LLMConfig, now: dict, most: dict) -> tuple[tuple[int, int], float]:
    """((min, max) actors, CPUs per actor) of the answering pool: llama.cpp up to ``llamacpp.num_actors`` engines, one
    CPU each as the embedded pool had; an OpenAI-compatible server, or vLLM (its own Ray Data job with its own engine
    pool), one client; the fake and torch engines one per CPU present, growing to one per declared CPU (`pools.pool_range`)."""
    if llm.backend == "llamacpp":
        return pool_range({"CPU": 1}, now, most, cap=llm.llamacpp.num_actors), 1.0
    if llm.backend in ("openai", "vllm"):
        return (1, 1), 1.0
    return pool_range({"CPU": 1}, now, most), 1.0


class RayPasses:
    """The passes on Ray: Ray Data over the plan's row groups; the ledger's index and the part files through tasks."""

    def __init__(self, job: PlanJob, identity: dict, engine=None, one_job: bool | None = None):
        import ray

        self.job, self.identity, self.engine = job, identity, engine
        self.one_job = job.llm.backend == "vllm" if one_job is None else one_job
        self.now = ray.cluster_resources()  # the pools start with one actor and may grow to what is declared
        self.most = declared(self.now, job.cfg.ray.max_cpus, job.cfg.ray.max_gpus)

    def index(self):
        import ray

        index, totals = ray.remote(num_returns=2)(ledger_index).remote(self.job.run_root, self.job.ledger)
        return index, ray.get(totals)  # the index stays in the object store: workers map it, the driver never reads it

    def map(self, mode: str, groups: list[int], index) -> Iterator[dict]:
        import ray

        if not groups:
            return
        if mode == "answer":
            size, cpus = engine_pool(self.job.llm, self.now, self.most)
        else:
            size, cpus = pool_range({"CPU": 1}, self.now, self.most), 1.0
        ds = ray.data.from_items([{"group": g} for g in groups], override_num_blocks=len(groups)).map_batches(
            _PassActor, fn_constructor_kwargs={"mode": mode, "job": self.job, "identity": self.identity, "index": index, "engine": self.engine},
            compute=ray.data.ActorPoolStrategy(min_size=min(size[0], len(groups)), max_size=min(size[1], len(groups))), batch_size=1,
            num_cpus=cpus)
        for r in ds.iter_rows():
            yield json.loads(r["out"])

    def answer(self, groups: list[int], index) -> dict[str, Any]:
        """The answer pass: an engine actor pool over the groups, or (vLLM) one Ray Data job per attempt (`answer_in_one_job`)."""
        if not self.one_job:
            sent: dict = {}
            for part in self.map("answer", groups, index):
                add_counters(sent, {k: part[k] for k in SENT_COUNTERS})
            return sent
        from cqg_ray.llm.backends import make_backend

        backend = self.engine() if self.engine is not None else make_backend(self.job.llm, cluster=self.job.cfg.ray)
        size = pool_range({"CPU": 1}, self.now, self.most)
        try:
            return answer_in_one_job(self.job, self.identity, groups, index, backend, size, lambda: self.index()[0])
        finally:
            backend.close()

    def concat(self) -> dict[str, int]:
        import ray

        return ray.get(ray.remote(concat_parts).remote(self.job.run_root, self.job.stage, self.job.parts))


# ----------------------------------------------------------------------------------------- the driver


def stream_plan(job: PlanJob, groups: list[int], identity: dict, backend=None, engine=None,
                on_assembled: Callable[[dict], None] | None = None, one_job: bool | None = None) -> dict[str, Any]:
    """Run ``job`` over the plan's row groups ``groups``: count, answer what the ledger lacks, assemble.

    ``backend`` (an instance) runs the passes in this process, as does the absence of a running Ray; ``engine`` (a
    function making a backend) is what each Ray worker answers with (default ``make_backend(job.llm, in_process=True)``);
    ``one_job`` (default: for vLLM) answers in one Ray Data job per attempt through ``engine().job`` instead.
    ``on_assembled`` sees each group's assemble counters (for counters the stage folds itself). Returns the summed
    counters: ``count`` and ``assemble`` (dicts), ``written`` (rows per part kind), ``llm`` (the ledger's totals)."""
    import ray

    from cqg_ray.llm.runner import MAX_RUNS_KEPT, new_run_stats

    t0 = time.time()
    passes = LocalPasses(job, identity, backend) if backend is not None or not ray.is_initialized() else RayPasses(job, identity, engine, one_job)
    index, before = passes.index()
    if before["recovered"]:
        log.info("llm %s: %d finished requests recovered from the journals of an interrupted run", job.ledger, before["recovered"])
    c: dict = {}
    work = []
    for part in passes.map("count", groups, index):
        add_counters(c, {k: v for k, v in part.items() if k != "group"})
        if part["to_send"] > 0:
            work.append(part["group"])
    log.info("llm %s: %d requests, %d unique, %d from the ledger, %d to send (%d batches, %d with work)", job.ledger, c.get("requests", 0),
             c.get("unique", 0), c.get("from_ledger", 0), c.get("to_send", 0), len(groups), len(work))

    from cqg_ray.rundir import RunDir

    ledger = Ledger(RunDir(job.run_root), job.ledger)
    stats = ledger.read_stats()
    wall_before = float(stats.get("totals", {}).get("wall_s", 0.0))
    this_run = new_run_stats(t0, c.get("requests", 0), c.get("unique", 0), c.get("from_ledger", 0), c.get("to_send", 0))
    stats["runs"] = [*stats.get("runs", [])[-(MAX_RUNS_KEPT - 1):], this_run]
    stats.update({"stage": job.ledger, "model": identity})
    totals = {k: v for k, v in before.items() if k != "recovered"}
    if work:
        sent = passes.answer(work, index)
        this_run.update({k: v for k, v in sent.items() if k != "shards"})
        index, after = passes.index()  # the workers' journals into a shard, and the ledger's keys again
        totals = {k: v for k, v in after.items() if k != "recovered"}
    this_run["wall_s"] = round(time.time() - t0, 3)
    this_run["complete"] = True
    if this_run["wall_s"] > 0:
        this_run["requests_per_s"] = round(this_run["sent"] / this_run["wall_s"], 3)
    stats["totals"] = {**totals, "wall_s": round(wall_before + this_run["wall_s"], 3)}
    ledger.write_stats(stats)
    log.info("llm %s: done in %.1fs: %d sent, %d failures, %d retries, %d prompt + %d completion tokens", job.ledger, this_run["wall_s"],
             this_run["sent"], this_run["failures"], this_run["retries"], this_run["prompt_tokens"], this_run["completion_tokens"])

    ledger.run.rm(job.stage, PARTS)
    a: dict = {}
    for part in passes.map("assemble", groups, index):
        if on_assembled is not None:
            on_assembled(part)
        add_counters(a, {k: v for k, v in part.items() if k != "group"})
    if a.get("missing"):
        raise RuntimeError(f"{job.ledger}: {a['missing']} planned requests have no answer in the ledger after the answer pass")
    return {"count": c, "assemble": a, "written": passes.concat(), "llm": stats["totals"], "run": this_run}
