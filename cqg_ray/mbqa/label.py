"""The labelling stage (`cqg-ray label`): LLM answers that train the MBQA heads (Appendix B).

Reads questions/ (the selected questions and their source clusters), cluster/ and prepare/; plans which
texts each question is asked about (``cqg_ray.mbqa.label_plan``: own cluster / nearest clusters / random, grouped
by text) and asks them through the LLM layer (ledger stage ``labels``: a killed run repeats no finished call),
in ``llm.answer_mode``: single-pass (one question per prompt, P(yes) from the logits, the text's prefix
shared by its questions) or packed (the paper's A.3, 20 questions per prompt). Writes under labels/:

    labels.parquet           doc_id, question_id, answer (bool), p_yes (float: always in single mode; null in packed mode without logprobs), source
    question_stats.parquet   question_id, planned, answered, yes, yes_rate
    failures.parquet         the prompts that stayed unreadable after llm.max_attempts: doc_id, question_ids, raw text, error
    stats.json
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import Clusters, load_questions, load_texts
from cqg_ray.config import PipelineConfig
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")

SOURCES = np.array(["cluster", "neighbor", "random"])


def label_requests(cfg: PipelineConfig, plan, questions: list[str], doc_ids: np.ndarray, texts: dict[str, str], fitter=None):
    """The requests of the plan (pure: plan + texts in, requests out) and, aligned, the text (row index) each asks about.

    ``llm.answer_mode`` single: one single-pass request per planned pair; packed: one A.3 request per planned prompt.
    With a ``fitter`` (``cqg_ray.llm.fit.PromptFitter``) a text too long for the engine's context is clipped.
    """
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.fit import PromptFitter
    from cqg_ray.llm.prompts import clip_text

    fitter = fitter or PromptFitter(None, "labels")
    reqs, req_doc = [], []
    for i, d in enumerate(plan.prompt_doc):
        qids = plan.prompt_questions[plan.prompt_offsets[i]: plan.prompt_offsets[i + 1]].tolist()
        doc_id = str(doc_ids[d])
        build = lambda t: answer_requests(t, qids, questions, cfg.llm.answer_mode, cfg.label.questions_per_prompt,  # noqa: E731
                                          cfg.llm.max_tokens_answer, meta={"doc_id": doc_id})
        new = fitter.text(clip_text(texts[doc_id], cfg.label.max_text_chars), build, what=f"text {doc_id}")
        reqs.extend(new)
        req_doc.extend([int(d)] * len(new))
    return reqs, np.asarray(req_doc, dtype=np.int64)


def run_labels(cfg: PipelineConfig, ctx: StageContext, backend=None, progress: bool = True) -> None:
    from cqg_ray.llm.fit import PromptFitter, budget_summary, stage_budget
    from cqg_ray.llm.runner import run_requests, stage_stats
    from cqg_ray.mbqa.label_plan import make_label_plan

    run = ctx.run
    t0 = time.time()
    qt = load_questions(run)
    questions = qt.column("text").to_pylist()
    q_clusters = qt.column("cluster").to_numpy()
    cl = Clusters.load(run)
    plan = make_label_plan(cl.labels, cl.neighbors, q_clusters, cfg.label)
    n_pairs = len(plan.pair_question)
    texts = load_texts(run, cl.doc_ids[np.unique(plan.prompt_doc)])
    budget = stage_budget(cfg.llm, backend)
    fitter = PromptFitter(budget, "labels")
    reqs, req_doc = label_requests(cfg, plan, questions, cl.doc_ids, texts, fitter)
    fitter.log()
    log.info("label: %d questions, %d texts, %d (text, question) pairs in %d prompts (%s answers, %.1f questions per prompt)",
             len(questions), len(np.unique(plan.pair_doc)), n_pairs, len(reqs), cfg.llm.answer_mode, n_pairs / max(1, len(reqs)))
    results = run_requests(reqs, cfg.llm, run, "labels", progress=progress, backend=backend)

    # source of each (doc, question) pair, for the labels table
    src_key = plan.pair_doc.astype(np.int64) * (len(questions) + 1) + plan.pair_question
    src_order = np.argsort(src_key)
    rows = {"doc_id": [], "question_id": [], "answer": [], "p_yes": [], "source": []}
    fails = {"doc_id": [], "question_ids": [], "text": [], "error": []}
    for r, d in zip(results, req_doc):
        if not r.ok or r.answers is None:
            fails["doc_id"].append(r.meta["doc_id"])
            fails["question_ids"].append(r.meta["question_ids"])
            fails["text"].append(r.text)
            fails["error"].append(r.error or "")
            continue
        qids = np.asarray(r.meta["question_ids"], dtype=np.int64)
        keys = int(d) * (len(questions) + 1) + qids
        pos = src_order[np.searchsorted(src_key, keys, sorter=src_order)]
        for j, q in enumerate(qids.tolist()):
            rows["doc_id"].append(r.meta["doc_id"])
            rows["question_id"].append(q)
            rows["answer"].append(bool(r.answers[j]))
            rows["p_yes"].append(None if r.p_yes is None else r.p_yes[j])
            rows["source"].append(str(SOURCES[plan.pair_source[pos[j]]]))
    labels = pa.table({"doc_id": pa.array(rows["doc_id"], pa.string()), "question_id": pa.array(rows["question_id"], pa.int32()),
                       "answer": pa.array(rows["answer"], pa.bool_()), "p_yes": pa.array(rows["p_yes"], pa.float32()),
                       "source": pa.array(rows["source"], pa.string())})
    run.write_table(f"{ctx.stage}/labels.parquet", labels)
    run.write_table(f"{ctx.stage}/failures.parquet", pa.table({
        "doc_id": pa.array(fails["doc_id"], pa.string()), "question_ids": pa.array(fails["question_ids"], pa.list_(pa.int32())),
        "text": pa.array(fails["text"], pa.string()), "error": pa.array(fails["error"], pa.string())}))

    m = len(questions)
    qid = labels.column("question_id").to_numpy()
    ans = labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int64)
    planned = np.bincount(plan.pair_question, minlength=m)
    answered = np.bincount(qid, minlength=m)
    yes = np.bincount(qid, weights=ans, minlength=m).astype(np.int64)
    run.write_table(f"{ctx.stage}/question_stats.parquet", pa.table({
        "question_id": np.arange(m, dtype=np.int32), "planned": planned, "answered": answered, "yes": yes,
        "yes_rate": np.where(answered > 0, yes / np.maximum(answered, 1), np.nan)}))
    llm = stage_stats(run, "labels")
    ctx.counts.update({"questions": m, "texts": int(len(np.unique(plan.pair_doc))), "pairs_planned": int(n_pairs), "prompts": len(reqs),
                       "pairs_labelled": int(labels.num_rows), "prompts_failed": len(fails["doc_id"]),
                       "yes_rate": round(float(ans.mean()), 4) if len(ans) else None, **fitter.report()})
    ctx.extra["prompt_budget"] = budget_summary(budget)
    ctx.extra["llm"] = llm.get("totals", llm)
    ctx.extra["wall_s"] = round(time.time() - t0, 1)
    run.write_json(f"{ctx.stage}/stats.json", {"counts": ctx.counts, "llm": ctx.extra["llm"]})

