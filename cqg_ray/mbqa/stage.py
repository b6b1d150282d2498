"""The training stage (`cqg-ray train`): labels + stored embeddings -> a self-contained model folder.

Reads labels/ (LLM answers), encode/ (the frozen embeddings of the labelled texts; never re-encoded),
questions/ (texts and provenance). The labels and embeddings reach the Ray Train workers through Ray Data
(``cqg_ray.mbqa.train_data``: Data workers join them per text); the driver reads the labels' doc_id column only, to
hold out ``train.holdout`` of the labelled documents, split once into a select and a report part
(``cqg_ray.mbqa.reliability``). A pass of Data workers after training counts the labels and the heads' mean P(yes)
and returns the held-out pairs with their logits: the select part calibrates the heads and drops the questions that
cannot be learnt; the report part gives each question's precision and recall and the Table 6 report. Writes ``<run>/model/``
(config.json, questions.json, heads.safetensors, eval_report.json), loadable with
``InterpretableEmbedder.load``. Ray Train checkpoints live in ``<run>/model/_train/<name>`` (``checkpoint_name``: the
stage's config and its inputs' fingerprints): a killed run resumes from the last one when the stage runs again with the
same config and inputs; other questions or labels train afresh.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray.artifacts import embedding_files, load_question_embeddings, load_questions
from cqg_ray.config import PipelineConfig, labeller_llm, llm_model_name, stage_hash
from cqg_ray.rundir import ArtifactError, RunDir, StageContext, hash_sections, reads

log = logging.getLogger("cqg_ray")


def model_budget(cfg: PipelineConfig):
    """The model's Budget from ``train.budget`` (the tau rule takes ``train.tau``)."""
    from cqg_ray.mbqa.budget import Budget

    b = cfg.train.budget
    if b.rule == "tau":
        return Budget(rule="tau", tau=cfg.train.tau, value=b.value)
    return Budget(rule="top_k", k=b.k, floor=b.floor, value=b.value, rank=b.rank)


def labelled_doc_ids(run) -> np.ndarray:
    """The distinct labelled doc ids, sorted: the doc_id column of labels.parquet (the one column the driver reads)."""
    run.require("labels")
    col = run.read_table("labels/labels.parquet", columns=["doc_id"]).column("doc_id")
    return np.sort(pc.unique(col).to_numpy(zero_copy_only=False).astype(str))


def labels_meta(run) -> tuple[int, int]:
    """(labelled pairs, pairs without P(yes)) from labels.parquet's footer, without reading its rows."""
    meta = pq.ParquetFile(run.path("labels", "labels.parquet"), filesystem=run.fs).metadata
    col = meta.schema.names.index("p_yes")
    missing = 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        missing += meta.row_group(g).num_rows if stats is None or not stats.has_null_count else stats.null_count
    return meta.num_rows, missing


def heldout_ids(ids: np.ndarray, train) -> tuple[np.ndarray, np.ndarray]:
    """(the held-out ids, those of them in the report part) of the sorted labelled doc ids, for a ``TrainConfig``: the
    split by document (`holdout_docs`), then the report part (`reliability.split_heldout`), fixed before anything is chosen."""
    from cqg_ray.mbqa.label_plan import holdout_docs
    from cqg_ray.mbqa.reliability import split_heldout

    held = ids[holdout_docs(np.arange(len(ids)), train.holdout, train.seed)]
    return held, held[~split_heldout(len(held), train.select_share, train.seed)]


def checkpoint_name(config_hash: str, inputs: dict[str, str | None]) -> str:
    """The Ray Train run name the heads' checkpoints are kept under: one per stage config and input fingerprints, so a
    killed run resumes its own checkpoints and a run on other questions or labels starts afresh."""
    return f"mbqa-{hash_sections(config_hash, inputs)}"


def run_train(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.reliability import format_reliability, reliability
    from cqg_ray.mbqa.report import format_report, is_table6
    from cqg_ray.mbqa.train import fit_heads
    from cqg_ray.mbqa.train_data import dataset_stats, run_texts, training_rows

    run = ctx.run
    t0 = time.time()
    qt = load_questions(run)
    m = qt.num_rows
    n_pairs, no_p_yes = labels_meta(run)
    if n_pairs == 0:
        raise RuntimeError("train: no labelled pairs (see labels/failures.parquet)")
    if cfg.train.soft_labels and no_p_yes:
        raise RuntimeError(f"train.soft_labels needs P(yes) for every label; {no_p_yes} of {n_pairs} have none "
                           "(label with llm.answer_mode=single, or with llm.logprobs on a backend that returns them)")
    ids = labelled_doc_ids(run)
    held, report_ids = heldout_ids(ids, cfg.train)
    files = embedding_files(run)
    d = pq.read_schema(files[0], filesystem=run.fs).field("embedding").type.list_size
    texts = run_texts(files, run.path("labels", "labels.parquet"), run.fs, held, cfg.train.soft_labels, report_ids=report_ids)
    storage = run.uri(ctx.stage, "_train")
    if run.local:
        os.makedirs(storage, exist_ok=True)
    name = checkpoint_name(stage_hash(cfg, "model"), {s: run.fingerprint(s) for s in reads(ctx.stage)})
    log.info("train: %d questions, %d labelled pairs over %d texts (d=%d, %d held out: %d select, %d report), %d worker(s), %d epochs, "
             "through Ray Data", m, n_pairs, len(ids), d, len(held), len(held) - len(report_ids), len(report_ids),
             cfg.train.num_workers, cfg.train.epochs)
    result = fit_heads(training_rows(texts), d, m, cfg.train, storage_path=storage, name=name, run=ctx.run,
                       q_vectors=question_vectors(cfg, run, qt.column("text").to_pylist()) if cfg.train.question_prior else None)
    stats = dataset_stats(texts, result.heads, cfg.train.tau)  # one more pass: counts, mean P(yes), held-out pairs
    if stats["texts"] != len(ids) or stats["train_pairs"] + stats["held_pairs"] != n_pairs:
        raise ArtifactError(f"{run.uri('encode')}: {stats['texts']:,} of the {len(ids):,} labelled texts have one embedding "
                            f"({stats['train_pairs'] + stats['held_pairs']:,} of {n_pairs:,} pairs); redo it: `cqg-ray run --force encode`")
    rel = reliability(stats["held_question"], stats["held_answer"], stats["held_logit"], stats["held_part"], m,
                      stats["train_labels"], stats["train_yes"], reliability_rules(cfg))
    heads = result.heads
    if rel.calibration["a"] != 1.0 or rel.calibration["b"] != 0.0:
        heads = heads.calibrated(rel.calibration["a"], rel.calibration["b"])
    if not rel.keep.all():
        heads = heads.subset(rel.keep)
    if heads is not result.heads:  # the means of what ships: one more pass with the calibrated, kept heads
        stats["prob_sum"] = dataset_stats(texts, heads, cfg.train.tau, means_only=True)["prob_sum"]
    report = heldout_report(stats, rel, cfg.train.tau)
    report["split"] = {"train_docs": stats["train_texts"], "heldout_docs": stats["texts"] - stats["train_texts"],
                       "select_docs": len(held) - len(report_ids), "report_docs": len(report_ids),
                       "train_pairs": stats["train_pairs"], "heldout_pairs": stats["held_pairs"],
                       "pos_weight": result.pos_weight, "epochs": result.epochs}
    if cfg.train.question_prior:
        report["question_prior"] = {"alpha": round(result.metrics["prior_alpha"], 4), "beta": round(result.metrics["prior_beta"], 4)}
    report["reliability"] = rel.report
    n_labels, n_yes = stats["labels"], stats["yes"]
    records = [{"id": str(r["question_id"]), "text": r["text"], "cluster": int(r["cluster"]),
                "quality": None if r["quality"] is None or r["quality"] != r["quality"] else float(r["quality"]),
                "method": r.get("method", "cqg"), "labels": int(n_labels[i]),
                "yes_rate": round(float(n_yes[i] / n_labels[i]), 4) if n_labels[i] else None,
                **{k: v for k, v in rel.fields[i].items() if k != "dropped"}}
               for i, r in enumerate(qt.to_pylist())]
    def listed(i: int, reason: str) -> dict:  # a question the rule dropped, as eval_report lists it
        return {"id": records[i]["id"], "text": records[i]["text"], "reason": reason, "select_auc": rel.fields[i]["select_auc"]}

    report["reliability"]["dropped"] = [listed(i, f["dropped"]) for i, f in enumerate(rel.fields) if f["dropped"]]
    report["reliability"]["kept_back"] = [listed(i, why) for i, why in rel.kept_back.items()]
    questions = [q for q, k in zip(records, rel.keep) if k]
    model = InterpretableEmbedder(cfg.encode.model, questions, heads, tau=cfg.train.tau, eval_report=report, device="cpu",
                                  budget=model_budget(cfg), mean=(stats["prob_sum"] / stats["texts"]).astype(np.float32))
    model.stats_source = f"the {len(ids)} labelled training texts of the run"
    model.labelled_by = labelled_by(cfg)
    model.save(run.uri(ctx.stage))
    if is_table6(report):
        print(format_report(report, title="Question answering on held-out documents (report part)"))
    print(format_reliability(rel.report))
    ctx.counts.update({"questions": len(questions), "questions_generated": m, "questions_dropped": m - len(questions),
                       "pairs": n_pairs, "texts": int(len(ids)), "epochs": result.epochs,
                       "pos_weight": round(float(result.pos_weight), 4),
                       "heldout_accuracy": report.get("accuracy") if isinstance(report, dict) else None})
    ctx.extra["final_metrics"] = result.metrics
    ctx.extra["wall_s"] = round(time.time() - t0, 1)


def question_vectors(cfg: PipelineConfig, run: RunDir, texts: list[str]) -> np.ndarray:
    """The questions' texts embedded by the run's encoder (the question prior's q_i: `mbqa.prior`): those the questions
    stage saved, else embedded here (a run from before it saved them)."""
    from cqg_ray.encoder import load_encoder

    saved = load_question_embeddings(run, cfg.encode.model, cfg.encode.backend, len(texts))
    if saved is not None:
        return saved
    log.info("train: embedding the %d questions for the question prior (%s)", len(texts), cfg.encode.model)
    return np.asarray(load_encoder(cfg.encode.model, backend=cfg.encode.backend).encode(texts, batch_size=128), dtype=np.float32)


def labelled_by(cfg: PipelineConfig) -> dict:
    """The LLM that labelled the run's training texts, as the model folder records it (config.json ``labelled_by``):
    the run's LLM with ``label.model`` in its place (``labeller_llm``), how it was asked, and for the embedded backend
    its single-pass engine setting (``score_engine``, as configured: ``auto`` stays ``auto``)."""
    llm = labeller_llm(cfg)
    engine = {"score_engine": llm.llamacpp.score_engine} if llm.backend == "llamacpp" else {}
    return {"backend": llm.backend, "model": llm_model_name(llm), "answer_mode": llm.answer_mode, "prompt": cfg.label.prompt,
            "yes_above": cfg.label.yes_above, **engine}


def operating_threshold(cfg: PipelineConfig) -> float:
    """The P(yes) above which the model's budget can make a question active: train.tau, or the top_k rule's floor."""
    b = cfg.train.budget
    return cfg.train.tau if b.rule == "tau" or b.floor is None else float(b.floor)


def reliability_rules(cfg: PipelineConfig):
    from cqg_ray.mbqa.reliability import Rules

    t = cfg.train
    return Rules(threshold=operating_threshold(cfg), calibrate=t.calibrate, min_heldout=t.min_heldout,
                 min_heldout_yes=t.min_heldout_yes, min_auc=t.min_auc, min_kept=t.min_kept)


def heldout_report(stats: dict, rel, tau: float) -> dict:
    """The Table 6 report on the report part's pairs of the kept questions, with the calibrated heads at tau ({} when
    there are none)."""
    from cqg_ray.mbqa.reliability import REPORT, sigmoid
    from cqg_ray.mbqa.train_data import confusion_report

    q, part = stats["held_question"].astype(np.int64), stats["held_part"]
    rows = (part == REPORT) & rel.keep[q]
    if not rows.any():
        return {}
    c = rel.calibration
    pred = sigmoid(c["a"] * stats["held_logit"][rows] + c["b"]) > tau
    answer = stats["held_answer"][rows].astype(np.int64)
    return confusion_report(np.bincount(answer * 2 + pred.astype(np.int64), minlength=4), tau)
