"""Streaming LLM stages: a plan in Parquet, workers that build, send and assemble its batches, a driver adding counters.

A stage writes its plan as Parquet (one row per prompt or per text, a row group per batch) and hands ``stream_plan``
a ``PlanJob`` (``cqg_ray.llm.plan_work``, the worker side): the stage's own code that turns one row group into requests
(``requests``) and answered requests into output parts (``assemble``). ``PlanWorker`` runs three passes of a job over
row groups, one group per call:

    count      how many of the batch's requests the ledger holds (a resume's log line; nothing sent)
    answer     sends the ones it lacks through the engine (``runner.answer_pending``: the runner's retry rules) and
               writes the rows into the ledger itself (``BatchWriter``: journal + large shards)
    assemble   looks the batch's keys up in the ledger (``KeyIndex``) and hands the results to the job, which writes
               its parts (``<stage>/parts/<kind>-<group>-<id>.parquet``), streamed into ``<stage>/<kind>.parquet`` at the end

On Ray the passes are Ray Data actor pools over the row groups (``RayPasses``; answering: an engine pool that grows
with the cluster, ``engine_pool``); without Ray, or with a backend handed in (tests, a warm engine), the same passes
run in this process (``LocalPasses``). The driver holds the plan's size and counters, never requests or results.
``ledger.KeyIndex`` is the ledger's key column, sorted, with where each key's row lies (shard, row): built once per
pass in a task, shared read-only with the workers through the object store. vLLM answers in one Ray Data job per
attempt instead of an actor pool (``answer_in_one_job``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.llm.ledger import Ledger, ledger_index
from cqg_ray.llm.plan_work import PARTS, PlanJob, PlanWorker, _LedgerRows, _PassActor, _PendingRows, one_pass, pass_group
from cqg_ray.pools import declared, pool_range

log = logging.getLogger("cqg_ray")

SENT_COUNTERS = ("sent", "finished", "failures", "retries", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "shards")


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


# ----------------------------------------------------------------------------------------- plans


def corpus_places(run, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of each of ``doc_ids`` (an Arrow string array, or anything ``pa.array`` takes) in the corpus shards;
    one shard's ids read at a time, and only that shard's ids hashed (each id is looked up in it)."""
    from cqg_ray.artifacts import ArtifactError, corpus_shards

    shard = np.full(len(doc_ids), -1, dtype=np.int32)
    row = np.zeros(len(doc_ids), dtype=np.int64)
    ids = pa.array(doc_ids, pa.string())
    for i, path in enumerate(corpus_shards(run)):
        mine = pq.read_table(path, columns=["doc_id"], filesystem=run.fs).column("doc_id").combine_chunks()
        pos = pc.index_in(ids, value_set=mine)
        found = pos.is_valid().to_numpy(zero_copy_only=False)
        shard[found] = i
        row[found] = pos.drop_null().to_numpy()
    if (shard < 0).any():
        raise ArtifactError(f"{int((shard < 0).sum())} documents are not in the corpus shards; redo `cqg-ray cluster`")
    return shard, row


def write_plan(run, path: str, table: pa.Table, rows: int) -> list[int]:
    """The plan at ``path`` (under the run), ``rows`` rows a row group; its row groups (the batches)."""
    import io

    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=max(1, rows), write_page_checksum=True)
    run.write_bytes(path, buf.getvalue())
    return list(range(pq.ParquetFile(pa.BufferReader(buf.getvalue())).num_row_groups)) if table.num_rows else []


# ----------------------------------------------------------------------------------------- the passes, mapped


def without_no_progress_timeout(ds):
    """``ds`` without Ray Data's no-progress timeout (30 minutes by default): an LLM pass gives no output until an engine
    call ends, and one call (a batch of 32 generation prompts of the 1.5B on 2 CPU cores) takes longer than that. A
    failed engine call still fails the pass; its finished answers are in the ledger."""
    ds.context.execution_no_progress_timeout_s = -1
    return ds


def answer_in_one_job(job: PlanJob, identity: dict, groups: list[int], index, backend, size: tuple[int, int], reindex) -> dict[str, Any]:
    """The answer pass as one Ray Data job per attempt: plan groups -> pending request rows (CPU actors) ->
    ``backend.job`` (vLLM: ``ray.data.llm``'s processor with its autoscaling engine pool) -> judged rows into the
    ledger (CPU actors). A row that failed with attempts left goes again in the next attempt's job, after
    ``reindex()`` (the journals into a shard, the keys again) tells the pending rows what is done; after the last
    attempt the caller reindexes, as after any answer pass."""
    import ray

    counters = dict.fromkeys(SENT_COUNTERS, 0)
    for attempt in range(1, job.llm.max_attempts + 1):
        pool = ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, min(size[1], len(groups))))
        ds = ray.data.from_items([{"group": g} for g in groups], override_num_blocks=len(groups)).map_batches(
            _PendingRows, fn_constructor_kwargs={"job": job, "identity": identity, "index": index, "attempt": attempt},
            compute=pool, batch_size=1, num_cpus=1)
        ds = backend.job(ds).map_batches(_LedgerRows, fn_constructor_kwargs={"job": job, "attempt": attempt},
                                         compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, size[1])), num_cpus=1,
                                         batch_size=1024)
        c: dict = {}
        for r in without_no_progress_timeout(ds).iter_rows():
            add_counters(c, json.loads(r["out"]))
        if attempt > 1:
            counters["retries"] += c.get("sent", 0)
        for k in ("sent", "finished", "failures", "prompt_tokens", "completion_tokens"):
            counters[k] += c.get(k, 0)
        if not c.get("again"):
            break  # the caller reindexes once the pass is over
        index = reindex()
        log.info("llm %s: attempt %d for %d requests", job.ledger, attempt + 1, c["again"])
    return counters


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


class _Passes:
    """What both kinds of passes share: the answer pass as a ``map`` of ``PlanWorker.answer`` whose counters are summed."""

    def answer(self, groups: list[int], index) -> dict[str, Any]:
        sent: dict = {}
        for part in self.map("answer", groups, index):
            add_counters(sent, {k: part[k] for k in SENT_COUNTERS})
        return sent


class LocalPasses(_Passes):
    """The passes in this process, one batch after another (tests, a backend handed in, no Ray)."""

    def __init__(self, job: PlanJob, identity: dict, backend):
        self.job, self.identity, self.backend = job, identity, backend

    def index(self):
        return ledger_index(self.job.run_root, self.job.ledger)

    def map(self, mode: str, groups: list[int], index) -> Iterator[dict]:
        worker = PlanWorker(self.job, self.identity, index=index, backend=self.backend)
        try:
            for g in groups:
                yield one_pass(worker, mode, g)
        finally:
            worker.close()

    def concat(self) -> dict[str, int]:
        return concat_parts(self.job.run_root, self.job.stage, self.job.parts)


def engine_pool(llm: LLMConfig, now: dict, most: dict) -> tuple[tuple[int, int], float]:
    """((min, max) actors, CPUs per actor) of the answering pool: llama.cpp up to ``llamacpp.num_actors`` engines, one
    CPU each as the embedded pool had; an OpenAI-compatible server, or vLLM (its own Ray Data job with its own engine
    pool), one client; the fake and torch engines one per CPU present, growing to one per declared CPU (`pools.pool_range`)."""
    if llm.backend == "llamacpp":
        return pool_range({"CPU": 1}, now, most, cap=llm.llamacpp.num_actors), 1.0
    if llm.backend in ("openai", "vllm"):
        return (1, 1), 1.0
    return pool_range({"CPU": 1}, now, most), 1.0


class RayPasses(_Passes):
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
        if mode != "answer" and len(groups) <= self.now.get("CPU", 1):
            # no more groups than CPUs: an actor pool would start one actor (a process, its imports) per group; a
            # task per group runs on Ray's pooled workers instead (a resumed or small stage: seconds, not a pool's start)
            task = ray.remote(num_cpus=1)(pass_group)
            for ref in [task.remote(mode, self.job, self.identity, index, g) for g in groups]:
                yield json.loads(ray.get(ref))
            return
        if mode == "answer":
            size, cpus = engine_pool(self.job.llm, self.now, self.most)
        else:
            size, cpus = pool_range({"CPU": 1}, self.now, self.most), 1.0
        ds = ray.data.from_items([{"group": g} for g in groups], override_num_blocks=len(groups)).map_batches(
            _PassActor, fn_constructor_kwargs={"mode": mode, "job": self.job, "identity": self.identity, "index": index, "engine": self.engine,
                                               "progress_queue": progress.queue() if mode == "answer" else None},
            compute=ray.data.ActorPoolStrategy(min_size=min(size[0], len(groups)), max_size=min(size[1], len(groups))), batch_size=1,
            num_cpus=cpus)
        for r in without_no_progress_timeout(ds).iter_rows():
            yield json.loads(r["out"])

    def answer(self, groups: list[int], index) -> dict[str, Any]:
        """The answer pass: an engine actor pool over the groups, or (vLLM) one Ray Data job per attempt (`answer_in_one_job`)."""
        if not self.one_job:
            return super().answer(groups, index)
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

    ``backend`` (an instance) runs the passes in this process, as do one kept for ``identity`` (`backends.keep_backend`)
    and the absence of a running Ray; ``engine`` (a
    function making a backend) is what each Ray worker answers with (default ``make_backend(job.llm, in_process=True)``);
    ``one_job`` (default: for vLLM) answers in one Ray Data job per attempt through ``engine().job`` instead.
    ``on_assembled`` sees each group's assemble counters (for counters the stage folds itself). Returns the summed
    counters: ``count`` and ``assemble`` (dicts), ``written`` (rows per part kind), ``llm`` (the ledger's totals)."""
    import ray

    from cqg_ray.llm.runner import MAX_RUNS_KEPT, new_run_stats

    t0 = time.time()
    if backend is None and engine is None:
        from cqg_ray.llm.backends import kept_backend

        backend = kept_backend(identity)  # an engine loaded in this process answers here (backends.keep_backend)
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
        ledger.write_stats(stats)  # the run's entry (to_send) from its start: `cqg-ray status` reads it
        to_send = c.get("to_send", 0)
        with progress.View(f"llm {job.ledger}", "req", to_send, run=ledger.run, stage=job.ledger, remote=isinstance(passes, RayPasses),
                           gen_per_request=c.get("expected_tokens", 0.0) / max(1, to_send)):
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
