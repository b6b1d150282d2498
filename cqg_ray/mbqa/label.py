"""The labelling stage (`cqg-ray label`): LLM answers that train the MBQA heads (Appendix B).

Reads questions/ (the selected questions and their source clusters), cluster/ and prepare/; plans which
texts each question is asked about (``cqg_ray.mbqa.label_plan``: own cluster / nearest clusters / random, grouped
by text) and asks them through the LLM layer (ledger stage ``labels``: a killed run repeats no finished call),
in ``llm.answer_mode``: single-pass (one question per prompt, P(yes) from the logits, the text's prefix
shared by its questions) or packed (the paper's A.3, 20 questions per prompt).

It streams: the driver holds the plan's arrays and counters, never the requests or the results. The plan is
written as Parquet (labels/plan/plan.parquet, one row per prompt, a row group per batch of ~10k pairs); Ray Data
maps ``cqg_ray.mbqa.label_work.LabelWorker`` over the row groups in three passes: count (what the ledger holds:
the log line, and the batches with work), answer (an engine actor pool; the workers build prompts from texts
they read themselves and write the answers into the ledger in large shards) and assemble (labels from the
ledger, written by the workers as parts, then streamed into one file). Without a running Ray, or with a backend
handed in (tests, a warm engine), the same passes run in this process, batch by batch. Writes under labels/:

    labels.parquet           doc_id, question_id, answer (bool), p_yes (float: always in single mode; null in packed mode without logprobs), source
    question_stats.parquet   question_id, planned, answered, yes, yes_rate
    failures.parquet         the prompts that stayed unreadable after llm.max_attempts: doc_id, question_ids, raw text, error
    stats.json
    plan/plan.parquet        the plan the passes read
"""

from __future__ import annotations

import io
import json
import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray.artifacts import Clusters, load_questions
from cqg_ray.config import PipelineConfig
from cqg_ray.pools import declared, pool_range
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")

def corpus_places(run, doc_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of each of ``doc_ids`` (sorted, as ``Clusters``) in the corpus shards; one shard's ids read at a time."""
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
        raise ArtifactError(f"{int((shard < 0).sum())} clustered documents are not in the corpus shards; redo `cqg-ray cluster`")
    return shard, row


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


def concat_parts(run_root: str, stage: str) -> dict[str, int]:
    """labels.parquet and failures.parquet from the assemble pass's parts, streamed one part at a time; parts removed."""
    from cqg_ray.mbqa.label_work import FAILURES_SCHEMA, LABELS_SCHEMA, PARTS
    from cqg_ray.rundir import RunDir

    run = RunDir(run_root)
    out = {}
    for kind, schema in (("labels", LABELS_SCHEMA), ("failures", FAILURES_SCHEMA)):
        parts = (pq.read_table(run.path(stage, PARTS, name), filesystem=run.fs)
                 for name in run.ls(stage, PARTS, suffix=".parquet") if name.startswith(kind + "-"))
        out[kind] = run.write_tables(f"{stage}/{kind}.parquet", schema, parts)
    run.rm(stage, PARTS)
    return out


def ledger_index(run_root: str, stage: str = "labels"):
    """(KeyIndex, totals) of a ledger after moving killed writers' journals into a shard; and how many rows were recovered."""
    from cqg_ray.llm.ledger import Ledger, latest, table_totals
    from cqg_ray.llm.runner import ACCOUNTING
    from cqg_ray.mbqa.label_work import KeyIndex
    from cqg_ray.rundir import RunDir

    ledger = Ledger(RunDir(run_root), stage)
    recovered = ledger.recover()
    return KeyIndex.build(ledger), {**table_totals(latest(ledger.columns(ACCOUNTING))), "recovered": recovered}


class LocalPasses:
    """The passes in this process, one batch after another (tests, a backend handed in, no Ray)."""

    def __init__(self, run_root: str, stage: str, cfg: PipelineConfig, identity: dict, backend):
        self.args, self.backend = (run_root, stage, cfg, identity), backend

    def index(self):
        return ledger_index(self.args[0])

    def map(self, mode: str, groups: list[int], index) -> list[dict]:
        from cqg_ray.mbqa.label_work import LabelWorker

        worker = LabelWorker(*self.args, index=index, backend=self.backend)
        try:
            return [{"group": g, **getattr(worker, mode)(g)} for g in groups]
        finally:
            worker.close()

    def concat(self) -> dict[str, int]:
        return concat_parts(self.args[0], self.args[1])


class _PassActor:
    """A Ray Data actor running one pass of ``LabelWorker`` over plan row groups (one group per call)."""

    def __init__(self, mode: str, args: tuple, index, engine):
        from cqg_ray.mbqa.label_work import LabelWorker

        self.mode, self.worker = mode, LabelWorker(*args, index=index, engine=engine)

    def __call__(self, batch: dict) -> dict:
        out = [json.dumps({"group": int(g), **getattr(self.worker, self.mode)(int(g))}) for g in batch["group"]]
        return {"out": np.array(out)}


class RayPasses:
    """The passes on Ray: Ray Data over the plan's row groups; the ledger's index and the part files through tasks."""

    def __init__(self, run_root: str, stage: str, cfg: PipelineConfig, identity: dict, engine=None):
        import ray

        self.args, self.cfg, self.engine = (run_root, stage, cfg, identity), cfg, engine
        self.now = ray.cluster_resources()  # the pools start with one actor and may grow to what is declared
        self.most = declared(self.now, cfg.ray.max_cpus, cfg.ray.max_gpus)

    def index(self):
        import ray

        index, totals = ray.remote(num_returns=2)(ledger_index).remote(self.args[0])
        return index, ray.get(totals)  # the index stays in the object store: workers map it, the driver never reads it

    def map(self, mode: str, groups: list[int], index) -> list[dict]:
        import ray

        if not groups:
            return []
        if mode == "answer":
            size, cpus = engine_pool(self.cfg.llm, self.now, self.most)
        else:
            size, cpus = pool_range({"CPU": 1}, self.now, self.most), 1.0
        ds = ray.data.from_items([{"group": g} for g in groups], override_num_blocks=len(groups)).map_batches(
            _PassActor, fn_constructor_kwargs={"mode": mode, "args": self.args, "index": index, "engine": self.engine},
            compute=ray.data.ActorPoolStrategy(min_size=min(size[0], len(groups)), max_size=min(size[1], len(groups))), batch_size=1,
            num_cpus=cpus)
        return [json.loads(r["out"]) for r in ds.iter_rows()]

    def concat(self) -> dict[str, int]:
        import ray

        return ray.get(ray.remote(concat_parts).remote(*self.args[:2]))


def engine_pool(llm, now: dict, most: dict) -> tuple[tuple[int, int], float]:
    """((min, max) actors, CPUs per actor) of the answering pool: llama.cpp up to ``llamacpp.num_actors`` engines, one
    CPU each as the embedded pool had; an OpenAI-compatible server one client (it has its own concurrency); the fake
    engine one per CPU present, growing to one per declared CPU (`pools.pool_range`)."""
    if llm.backend == "llamacpp":
        return pool_range({"CPU": 1}, now, most, cap=llm.llamacpp.num_actors), 1.0
    if llm.backend == "openai":
        return (1, 1), 1.0
    return pool_range({"CPU": 1}, now, most), 1.0


def run_labels(cfg: PipelineConfig, ctx: StageContext, backend=None, progress: bool = True, engine=None) -> None:
    """The stage; ``backend`` (an instance) runs it in this process, ``engine`` (a function making one) is what each Ray
    worker answers with (default: ``make_backend(cfg.llm, in_process=True)``)."""
    from cqg_ray.llm.base import backend_identity
    from cqg_ray.llm.fit import budget_summary, stage_budget
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.llm.runner import MAX_RUNS_KEPT, new_run_stats
    from cqg_ray.mbqa.label_plan import make_label_plan
    from cqg_ray.mbqa.label_work import FIT_COUNTS, PLAN, batch_rows, plan_table

    run = ctx.run
    t0 = time.time()
    qt = load_questions(run)
    m = qt.num_rows
    q_clusters = qt.column("cluster").to_numpy()
    del qt
    cl = Clusters.load(run)
    plan = make_label_plan(cl.labels, cl.neighbors, q_clusters, cfg.label)
    n_pairs, n_texts, n_prompts = plan.n_pairs, int(len(np.unique(plan.pair_doc))), plan.n_prompts
    planned = np.bincount(plan.pair_question, minlength=m)
    doc_shard, doc_row = corpus_places(run, cl.doc_ids)
    table = plan_table(plan, cl.doc_ids, doc_shard, doc_row)
    del plan, cl, doc_shard, doc_row
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=batch_rows(cfg.label.questions_per_prompt))
    del table
    run.write_bytes(f"{ctx.stage}/{PLAN}", buf.getvalue())
    del buf
    groups = list(range(pq.ParquetFile(run.path(ctx.stage, PLAN), filesystem=run.fs).num_row_groups))

    import ray

    identity = backend.identity if backend is not None else backend_identity(cfg.llm)
    args = (run.root_uri, ctx.stage, cfg, identity)
    passes = LocalPasses(*args, backend) if backend is not None or not ray.is_initialized() else RayPasses(*args, engine)
    index, before = passes.index()
    if before["recovered"]:
        log.info("llm labels: %d finished requests recovered from the journals of an interrupted run", before["recovered"])
    counted = passes.map("count", groups, index)
    c = {}
    for part in counted:
        add_counters(c, {k: v for k, v in part.items() if k not in ("group", "fit")})
    log.info("label: %d questions, %d texts, %d (text, question) pairs in %d prompts (%s answers), %d batches",
             m, n_texts, n_pairs, n_prompts, cfg.llm.answer_mode, len(groups))
    log.info("llm labels: %d requests, %d unique, %d from the ledger, %d to send", c.get("requests", 0), c.get("unique", 0),
             c.get("from_ledger", 0), c.get("to_send", 0))

    ledger = Ledger(run, "labels")
    stats = ledger.read_stats()
    wall_before = float(stats.get("totals", {}).get("wall_s", 0.0))
    this_run = new_run_stats(t0, c.get("requests", 0), c.get("unique", 0), c.get("from_ledger", 0), c.get("to_send", 0))
    stats["runs"] = [*stats.get("runs", [])[-(MAX_RUNS_KEPT - 1):], this_run]
    stats.update({"stage": "labels", "model": identity})
    work = [p["group"] for p in counted if p["to_send"] > 0]
    totals = {k: v for k, v in before.items() if k != "recovered"}
    if work:
        sent: dict = {}
        for part in passes.map("answer", work, index):
            add_counters(sent, {k: part[k] for k in ("sent", "finished", "failures", "retries", "prompt_tokens", "cached_prompt_tokens",
                                                     "completion_tokens", "shards")})
        this_run.update({k: v for k, v in sent.items() if k != "shards"})
        index, after = passes.index()  # the workers' journals into a shard, and the ledger's keys again
        totals = {k: v for k, v in after.items() if k != "recovered"}
    this_run["wall_s"] = round(time.time() - t0, 3)
    this_run["complete"] = True
    if this_run["wall_s"] > 0:
        this_run["requests_per_s"] = round(this_run["sent"] / this_run["wall_s"], 3)
    stats["totals"] = {**totals, "wall_s": round(wall_before + this_run["wall_s"], 3)}
    ledger.write_stats(stats)
    log.info("llm labels: done in %.1fs: %d sent, %d failures, %d retries, %d prompt + %d completion tokens", this_run["wall_s"],
             this_run["sent"], this_run["failures"], this_run["retries"], this_run["prompt_tokens"], this_run["completion_tokens"])

    run.rm(ctx.stage, "parts")
    a: dict = {}
    for part in passes.map("assemble", groups, index):
        add_counters(a, {k: v for k, v in part.items() if k != "group"})
    if a.get("missing"):
        raise RuntimeError(f"labels: {a['missing']} planned requests have no answer in the ledger after the answer pass")
    written = passes.concat()
    answered = np.asarray(a.get("answered", [0] * m), dtype=np.int64)
    yes = np.asarray(a.get("yes_per_question", [0] * m), dtype=np.int64)
    run.write_table(f"{ctx.stage}/question_stats.parquet", pa.table({
        "question_id": np.arange(m, dtype=np.int32), "planned": planned, "answered": answered, "yes": yes,
        "yes_rate": np.where(answered > 0, yes / np.maximum(answered, 1), np.nan)}))
    fit = a.get("fit", {k: 0 for k in (*FIT_COUNTS, "max_tokens_before")})
    budget = stage_budget(cfg.llm, backend)
    fit_report = {"prompts_checked": fit["checked"], "prompts_clipped": fit["clipped"], "texts_dropped": fit["texts_dropped"],
                  "chars_cut": fit["chars_cut"], "longest_prompt_tokens": fit["max_tokens_before"]}
    if fit["clipped"]:
        log.warning("labels: %d of %d prompts clipped to fit the context: %d characters cut", fit["clipped"], fit["checked"], fit["chars_cut"])
    labelled = written["labels"]
    ctx.counts.update({"questions": m, "texts": n_texts, "pairs_planned": int(n_pairs), "prompts": int(a.get("requests", 0)),
                       "pairs_labelled": int(labelled), "prompts_failed": int(written["failures"]),
                       "yes_rate": round(a["yes"] / labelled, 4) if labelled else None, **fit_report})
    ctx.extra["prompt_budget"] = budget_summary(budget)
    ctx.extra["llm"] = stats["totals"]
    ctx.extra["wall_s"] = round(time.time() - t0, 1)
    run.write_json(f"{ctx.stage}/stats.json", {"counts": ctx.counts, "llm": ctx.extra["llm"]})
