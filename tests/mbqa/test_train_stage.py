"""The train stage reads labels and embeddings through Ray Data: its model folder says what the arrays say."""

import json

import numpy as np
import pytest

from cqg_ray.artifacts import load_embeddings, load_labels
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.mbqa.pairs import LabelPairs, split_holdout
from cqg_ray.mbqa.report import evaluate_heads


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, clustered_run, corpus_file):
    from cqg_ray.config import stage_hash
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.mbqa.stage import run_train
    from cqg_ray.rundir import RunDir, run_stage
    from tests.conftest import copy_clustered, small_config
    from tests.evaluate.conftest import lexical_oracle

    d = copy_clustered(clustered_run, tmp_path_factory.mktemp("train_stage") / "run")
    cfg = small_config(d, corpus_file, t=3, filters=["copy", "example", "long", "cut_off"],
                       extra={"train": {"epochs": 20, "holdout": 0.2, "num_workers": 2, "checkpoint_every": 20}})
    run = RunDir(str(d))
    oracle = FakeBackend(cfg.llm, reply=lexical_oracle)
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=oracle, progress=False))
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=oracle, progress=False))
    manifest = run_stage(run, "model", stage_hash(cfg, "model"), lambda ctx: run_train(cfg, ctx))
    return run, cfg, manifest


def test_the_model_folder_matches_the_labels_and_embeddings(trained_run):
    """Counts, the held-out split and its two parts, the Table 6 report on the report part, each question's figures,
    the kept questions and the means: computed here from arrays (labels and embeddings loaded whole), against what the
    Ray Data passes wrote."""
    from cqg_ray.mbqa.label_plan import holdout_docs
    from cqg_ray.mbqa.reliability import split_heldout

    run, cfg, manifest = trained_run
    labels = load_labels(run)
    doc_ids = labels.column("doc_id").to_numpy(zero_copy_only=False)
    ids, emb = load_embeddings(run, np.unique(doc_ids))
    m = int(labels.column("question_id").to_numpy().max()) + 1
    pairs = LabelPairs(np.searchsorted(ids, doc_ids), labels.column("question_id").to_numpy(),
                       labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int8), m)
    train, test = split_holdout(pairs, cfg.train.holdout, cfg.train.seed)
    held = holdout_docs(pairs.doc, cfg.train.holdout, cfg.train.seed)
    report_docs = held[~split_heldout(len(held), cfg.train.select_share, cfg.train.seed)]
    model = InterpretableEmbedder.load(run.uri("model"), device="cpu")
    report = json.loads(open(run.uri("model", "eval_report.json")).read())
    assert report["split"] == {"train_docs": len(np.unique(train.doc)), "heldout_docs": len(np.unique(test.doc)),
                               "select_docs": len(held) - len(report_docs), "report_docs": len(report_docs),
                               "train_pairs": len(train), "heldout_pairs": len(test),
                               "pos_weight": pytest.approx(train.auto_pos_weight()), "epochs": 20}
    rel = report["reliability"]
    keep = np.ones(m, bool)
    keep[[int(d["id"]) for d in rel["dropped"]]] = False
    assert rel["questions"]["kept"] == model.m == int(keep.sum()) and manifest["counts"]["questions_dropped"] == m - model.m
    assert rel["kept_back"] == [] and rel["questions"]["kept_for_min_kept"] == 0  # train.min_kept 0: the rule alone
    # the report part of the kept questions, renumbered as the model's dimensions, answered by the shipped heads
    rep = pairs.select(np.isin(pairs.doc, report_docs) & keep[pairs.question])
    rep = LabelPairs(rep.doc, (np.cumsum(keep) - 1)[rep.question], rep.answer, model.m)
    expected = evaluate_heads(model.heads, emb, rep, cfg.train.tau)
    assert {k: v for k, v in report.items() if k not in ("split", "reliability")} == expected
    questions = json.loads(open(run.uri("model", "questions.json")).read())
    n = np.bincount(pairs.question, minlength=m)[keep]
    assert [q["labels"] for q in questions] == n.tolist() and [q["id"] for q in questions] == [str(i) for i in np.flatnonzero(keep)]
    p_rep = rep.answer == 1
    said = evaluate_pairs_yes(model, emb, rep, cfg.train.budget.floor)
    for i, q in enumerate(questions):
        mine = rep.question == i
        assert q["n_heldout"] == int(mine.sum()) and q["heldout_yes"] == int((mine & p_rep).sum())
        assert q["heldout_said_yes"] == int((mine & said).sum())
        if q["precision"] is not None:
            assert q["precision"] == round(float((mine & said & p_rep).sum() / (mine & said).sum()), 4)
    assert manifest["counts"]["pairs"] == len(pairs) and manifest["counts"]["texts"] == len(ids)
    assert model.mean == pytest.approx(model.heads.mean_probabilities(emb), abs=1e-6)
    # the folder names the LLM that labelled it (the faithfulness task compares its judge with it)
    assert model.labelled_by == {"backend": "fake", "model": "fake", "answer_mode": cfg.llm.answer_mode, "prompt": "answer",
                                 "yes_above": 0.5}
    assert json.loads(open(run.uri("model", "config.json")).read())["labelled_by"] == model.labelled_by


def evaluate_pairs_yes(model, emb, pairs, threshold):
    from cqg_ray.mbqa.report import predict_pairs

    return predict_pairs(model.heads, emb, pairs.doc, pairs.question) > threshold


def test_checkpoints_are_kept_per_config_and_inputs():
    """A killed run resumes its own checkpoints (same config, same inputs: the same name); other questions or labels
    (the reference rebuild's questions went from 163 to 268) must not resume a checkpoint of other heads."""
    from cqg_ray.mbqa.stage import checkpoint_name

    inputs = {"questions": "q1", "labels": "l1", "encode": "e1"}
    name = checkpoint_name("c1", inputs)
    assert name == checkpoint_name("c1", dict(reversed(list(inputs.items())))) and name.startswith("mbqa-")
    assert len({name, checkpoint_name("c2", inputs), checkpoint_name("c1", {**inputs, "questions": "q2"}),
                checkpoint_name("c1", {**inputs, "labels": "l2"}), checkpoint_name("c1", {**inputs, "encode": None})}) == 5


def test_the_stage_run_again_on_other_questions_trains_afresh(trained_run, tmp_path, corpus_file):
    """Run again after its questions and labels changed (t 3 -> 2), the stage trains heads for the new questions
    beside the old run's checkpoints instead of resuming them (it failed on the heads' shapes before)."""
    import shutil

    from cqg_ray.config import stage_hash
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.mbqa.stage import run_train
    from cqg_ray.rundir import RunDir, run_stage
    from tests.conftest import small_config
    from tests.evaluate.conftest import lexical_oracle

    run0, cfg0, manifest0 = trained_run
    d = tmp_path / "run"
    shutil.copytree(run0.root, d)
    cfg = small_config(d, corpus_file, t=2, filters=["copy", "example", "long", "cut_off"],
                       extra={"train": {"epochs": 20, "holdout": 0.2, "num_workers": 2, "checkpoint_every": 20}})
    run = RunDir(str(d))
    oracle = FakeBackend(cfg.llm, reply=lexical_oracle)
    q = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=oracle, progress=False))
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=oracle, progress=False))
    manifest = run_stage(run, "model", stage_hash(cfg, "model"), lambda ctx: run_train(cfg, ctx))
    assert q["counts"]["questions"] < manifest0["counts"]["questions_generated"]
    assert manifest["counts"]["questions_generated"] == q["counts"]["questions"]
    assert manifest["final_metrics"]["start_epoch"] == 0  # trained afresh
    assert len([p for p in (d / "model" / "_train").iterdir() if p.name.startswith("mbqa-")]) == 2


def test_labelled_by_records_how_the_labels_were_asked_and_the_embedded_engine_setting():
    from cqg_ray.config import PipelineConfig
    from cqg_ray.mbqa.stage import labelled_by

    cfg = PipelineConfig(llm={"llamacpp": {"model": "bundled:qwen2.5-coder-0.5b", "score_engine": "torch-float32"}},
                         label={"model": "bundled:qwen2.5-coder-1.5b", "prompt": "judge", "yes_above": 0.162})
    assert labelled_by(cfg) == {"backend": "llamacpp", "model": "bundled:qwen2.5-coder-1.5b", "answer_mode": "single", "prompt": "judge",
                                "yes_above": 0.162, "score_engine": "torch-float32"}
    assert labelled_by(PipelineConfig())["score_engine"] == "auto"  # as configured: auto is resolved where the links run
    served = PipelineConfig(llm={"backend": "openai", "openai": {"model": "Qwen/Qwen2.5-7B-Instruct"}})
    assert labelled_by(served) == {"backend": "openai", "model": "Qwen/Qwen2.5-7B-Instruct", "answer_mode": "single", "prompt": "answer",
                                   "yes_above": 0.5}


def test_the_question_prior_is_fitted_over_both_workers_and_folded_into_the_saved_heads(trained_run, tmp_path, corpus_file):
    """train.question_prior on the same run (two Ray Train workers): alpha and beta are the logistic fit of every
    training pair's answer on its text-question cosine (the workers' sums all-reduced), as computed here from arrays;
    the saved heads have hidden + 2 units and load as any model's."""
    import shutil

    from cqg_ray.config import stage_hash
    from cqg_ray.mbqa.prior import fit_prior, pair_cosines, unit_rows
    from cqg_ray.mbqa.stage import question_vectors, run_train
    from cqg_ray.rundir import RunDir, run_stage
    from tests.conftest import small_config

    run0, cfg0, _ = trained_run
    d = tmp_path / "run"
    shutil.copytree(run0.root, d)
    cfg = small_config(d, corpus_file, t=3, filters=["copy", "example", "long", "cut_off"],
                       extra={"train": {"epochs": 20, "holdout": 0.2, "num_workers": 2, "checkpoint_every": 20, "question_prior": True}})
    run = RunDir(str(d))
    manifest = run_stage(run, "model", stage_hash(cfg, "model"), lambda ctx: run_train(cfg, ctx))
    report = json.loads((d / "model" / "eval_report.json").read_text())
    labels = load_labels(run)
    doc_ids = labels.column("doc_id").to_numpy(zero_copy_only=False)
    ids, emb = load_embeddings(run, np.unique(doc_ids))
    m = manifest["counts"]["questions_generated"]
    pairs = LabelPairs(np.searchsorted(ids, doc_ids), labels.column("question_id").to_numpy(),
                       labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int8), m)
    train, _ = split_holdout(pairs, cfg.train.holdout, cfg.train.seed)
    from cqg_ray.artifacts import load_questions

    texts = load_questions(run).column("text").to_pylist()
    saved = question_vectors(cfg, run, texts)  # the questions stage's (dedup's) embeddings, read back
    (d / "questions" / "embeddings.parquet").unlink()
    encoded = question_vectors(cfg, run, texts)  # a run from before they were saved: embedded here
    np.testing.assert_allclose(saved, encoded, atol=1e-5)
    q = unit_rows(saved)
    alpha, beta = fit_prior(pair_cosines(emb, train.doc, train.question, q), train.answer)
    assert report["question_prior"] == {"alpha": pytest.approx(alpha, abs=1e-3), "beta": pytest.approx(beta, abs=1e-3)}
    assert alpha > 0  # texts nearer a question answer it yes more often (the lexical oracle's answers)
    model = InterpretableEmbedder.load(str(d / "model"), device="cpu")
    assert model.heads.hidden == cfg.train.hidden + 2
    assert manifest["final_metrics"]["prior_alpha"] == pytest.approx(alpha, abs=1e-3)
