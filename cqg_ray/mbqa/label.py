"""The labelling stage (`cqg-ray label`): LLM answers that train the MBQA heads (Appendix B).

Reads questions/ (the selected questions and their source clusters), cluster/ and prepare/; plans which
texts each question is asked about (``cqg_ray.mbqa.label_plan``: own cluster / nearest clusters / random, grouped
by text) and asks them through the LLM layer (ledger stage ``labels``: a killed run repeats no finished call),
in ``llm.answer_mode``: single-pass (one question per prompt, P(yes) from the logits, the text's prefix
shared by its questions) or packed (the paper's A.3, 20 questions per prompt). ``label.model`` labels with another
model than the run's LLM (the probes keep it), ``label.prompt=judge`` with the faithfulness judge's prompt.

It streams: the driver holds the plan's arrays and counters, never the requests or the results. The plan is
written as Parquet (labels/plan/plan.parquet, one row per prompt, a row group per batch of ~10k pairs); ``cqg_ray.llm.stream``
runs ``cqg_ray.mbqa.label_work.LabelJob`` over the row groups in three passes: count (what the ledger holds:
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

import logging
import time

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import Clusters, load_questions
from cqg_ray.config import PipelineConfig, labeller_llm, llm_model_name
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")


def run_labels(cfg: PipelineConfig, ctx: StageContext, backend=None, progress: bool = True, engine=None, one_job: bool | None = None) -> None:
    """The stage; ``backend`` (an instance) runs it in this process, ``engine`` (a function making one) is what each Ray
    worker answers with (default: ``make_backend(labeller_llm(cfg), in_process=True)``); ``one_job``: answer in one Ray Data job
    through ``engine().job`` (default: for vLLM; see ``cqg_ray.llm.stream.answer_in_one_job``)."""
    from cqg_ray.llm.base import backend_identity
    from cqg_ray.llm.backends import stage_budget
    from cqg_ray.llm.fit import budget_summary, fit_report
    from cqg_ray.llm.stream import corpus_places, stream_plan, write_plan
    from cqg_ray.mbqa.label_plan import make_label_plan
    from cqg_ray.mbqa.label_work import PLAN, LabelJob, batch_rows, plan_table

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
    groups = write_plan(run, f"{ctx.stage}/{PLAN}", table, batch_rows(cfg.label.questions_per_prompt))
    del table
    llm = labeller_llm(cfg)
    log.info("label: %d questions, %d texts, %d (text, question) pairs in %d prompts (%s answers, the %s prompt, %s), %d batches",
             m, n_texts, n_pairs, n_prompts, cfg.llm.answer_mode, cfg.label.prompt, llm_model_name(llm), len(groups))

    identity = backend.identity if backend is not None else backend_identity(llm)
    done = stream_plan(LabelJob(run.root_uri, ctx.stage, "labels", cfg, llm), groups, identity, backend=backend, engine=engine, one_job=one_job)
    a, written = done["assemble"], done["written"]
    answered = np.asarray(a.get("answered", [0] * m), dtype=np.int64)
    yes = np.asarray(a.get("yes_per_question", [0] * m), dtype=np.int64)
    run.write_table(f"{ctx.stage}/question_stats.parquet", pa.table({
        "question_id": np.arange(m, dtype=np.int32), "planned": planned, "answered": answered, "yes": yes,
        "yes_rate": np.where(answered > 0, yes / np.maximum(answered, 1), np.nan)}))
    fit = fit_report(a.get("fit", {}))
    budget = stage_budget(llm, backend)
    if fit["prompts_clipped"]:
        log.warning("labels: %d of %d prompts clipped to fit the context: %d characters cut", fit["prompts_clipped"], fit["prompts_checked"],
                    fit["chars_cut"])
    labelled = written["labels"]
    ctx.counts.update({"questions": m, "texts": n_texts, "pairs_planned": int(n_pairs), "prompts": int(a.get("requests", 0)),
                       "pairs_labelled": int(labelled), "prompts_failed": int(written["failures"]),
                       "yes_rate": round(a["yes"] / labelled, 4) if labelled else None, **fit})
    ctx.extra["prompt_budget"] = budget_summary(budget)
    ctx.extra["llm"] = done["llm"]
    ctx.extra["wall_s"] = round(time.time() - t0, 1)
    run.write_json(f"{ctx.stage}/stats.json", {"counts": ctx.counts, "llm": ctx.extra["llm"]})
