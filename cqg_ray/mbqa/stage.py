"""The training stage (`cqg-ray train`): labels + stored embeddings -> a self-contained model folder.

Reads labels/ (LLM answers), encode/ (the frozen embeddings of the labelled texts; never re-encoded),
questions/ (texts and provenance); trains the stacked heads with Ray Train (``cqg_ray.mbqa.train``), holds
out ``train.holdout`` of the labelled documents for the paper's Table 6 report, and writes ``<run>/model/``
(config.json, questions.json, heads.safetensors, eval_report.json), loadable with
``InterpretableEmbedder.load``. Ray Train checkpoints live in ``<run>/model/_train/``: a killed run resumes
from the last one when the stage runs again with the same config.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from cqg_ray.artifacts import load_embeddings, load_labels, load_questions
from cqg_ray.config import PipelineConfig, stage_hash
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")


def model_budget(cfg: PipelineConfig):
    """The model's Budget from ``train.budget`` (the tau rule takes ``train.tau``)."""
    from cqg_ray.mbqa.budget import Budget

    b = cfg.train.budget
    if b.rule == "tau":
        return Budget(rule="tau", tau=cfg.train.tau, value=b.value)
    return Budget(rule="top_k", k=b.k, floor=b.floor, value=b.value, rank=b.rank)


def run_train(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.report import format_report
    from cqg_ray.mbqa.train import LabelPairs, train_and_evaluate

    run = ctx.run
    t0 = time.time()
    labels = load_labels(run)
    qt = load_questions(run)
    m = qt.num_rows
    if labels.num_rows == 0:
        raise RuntimeError("train: no labelled pairs (see labels/failures.parquet)")
    doc_ids = labels.column("doc_id").to_numpy(zero_copy_only=False)
    ids, emb = load_embeddings(run, np.unique(doc_ids))
    target = None
    if cfg.train.soft_labels:
        p_yes = labels.column("p_yes")
        if p_yes.null_count:
            raise RuntimeError(f"train.soft_labels needs P(yes) for every label; {p_yes.null_count} of {labels.num_rows} have none "
                               "(label with llm.answer_mode=single, or with llm.logprobs on a backend that returns them)")
        target = p_yes.to_numpy(zero_copy_only=False)
    pairs = LabelPairs(np.searchsorted(ids, doc_ids), labels.column("question_id").to_numpy(),
                       labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int8), m, target)
    storage = run.uri(ctx.stage, "_train")
    if run.local:
        os.makedirs(storage, exist_ok=True)
    name = f"mbqa-{stage_hash(cfg, 'model')}"
    log.info("train: %d questions, %d labelled pairs over %d texts (d=%d), %d worker(s), %d epochs", m, len(pairs), len(ids), emb.shape[1],
             cfg.train.num_workers, cfg.train.epochs)
    result, report = train_and_evaluate(emb, pairs, cfg.train, storage_path=storage, name=name)
    n_labels = np.bincount(pairs.question, minlength=m)
    n_yes = np.bincount(pairs.question, weights=pairs.answer, minlength=m)
    questions = [{"id": str(r["question_id"]), "text": r["text"], "cluster": int(r["cluster"]),
                  "quality": None if r["quality"] is None or r["quality"] != r["quality"] else float(r["quality"]),
                  "method": r.get("method", "cqg"), "labels": int(n_labels[i]),
                  "yes_rate": round(float(n_yes[i] / n_labels[i]), 4) if n_labels[i] else None}
                 for i, r in enumerate(qt.to_pylist())]
    model = InterpretableEmbedder(cfg.encode.model, questions, result.heads, tau=cfg.train.tau, eval_report=report, device="cpu",
                                  budget=model_budget(cfg), mean=result.heads.mean_probabilities(emb))
    model.stats_source = f"the {len(ids)} labelled training texts of the run"
    model.save(run.uri(ctx.stage))
    print(format_report(report))
    ctx.counts.update({"questions": m, "pairs": len(pairs), "texts": int(len(ids)), "epochs": result.epochs,
                       "pos_weight": round(float(result.pos_weight), 4),
                       "heldout_accuracy": report.get("accuracy") if isinstance(report, dict) else None})
    ctx.extra["final_metrics"] = result.metrics
    ctx.extra["wall_s"] = round(time.time() - t0, 1)

