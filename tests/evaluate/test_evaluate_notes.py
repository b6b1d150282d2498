"""What the report says of a set it cannot score as asked: an STS file whose Spearman is undefined (one pair, equal
gold scores, equal model scores) says why beside its n/a; a retrieval set whose qrels name documents its corpus lacks
says how many (and none at all is an error). And the report's files are one set: results.json, the record, comes last."""

import json
import logging
import math

import pytest

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.data import DataError, load_beir
from cqg_ray.evaluate.report import evaluate_model, format_tables, render_markdown, write_report

from tests.evaluate.conftest import Lookup

STS_VECTORS = {"a": [1, 0], "b": [1, 1], "c": [0, 1]}


def write_sts(path, pairs) -> str:
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{s1}\t{s2}\t{g}\n" for s1, s2, g in pairs))
    return str(path)


def test_an_undefined_sts_spearman_says_why_in_the_table_the_report_and_the_json(tmp_path):
    """n/a stood alone: a file of one pair, or of equal gold scores, or a model whose similarities are all equal."""
    files = [write_sts(tmp_path / "one.tsv", [("a", "b", 3)]),
             write_sts(tmp_path / "flat.tsv", [("a", "b", 2), ("a", "c", 2), ("b", "c", 2)]),
             write_sts(tmp_path / "ok.tsv", [("a", "a", 3), ("a", "b", 2), ("a", "c", 1)])]  # cosines 1, .707, 0
    models = {"Lookup": Lookup(STS_VECTORS), "Flat": Lookup({t: [1, 1] for t in STS_VECTORS})}  # Flat: every cosine 1
    cfg = EvaluateConfig(tasks=["sts"], sts=files, baselines=[])
    results = evaluate_model(models, cfg, str(tmp_path / "ev"), print_table=False)

    assert results["scores"]["sts"] == {"Lookup": {"one": None, "flat": None, "ok": 100.0},
                                        "Flat": {"one": None, "flat": None, "ok": None}}
    why = {"sts": {"Lookup": {"one": "one pair", "flat": "all gold scores equal"},
                   "Flat": {"one": "one pair", "flat": "all gold scores equal", "ok": "all model scores equal"}}}
    assert results["na_reasons"] == why
    on_disk = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert on_disk["scores"]["sts"]["Flat"] == {"one": None, "flat": None, "ok": None} and on_disk["na_reasons"] == why
    assert format_tables(results).splitlines() == [
        "STS: Spearman correlation of cosine similarity (x100)",
        "                     one                         flat                            ok     Avg.",
        "Lookup    n/a (one pair)  n/a (all gold scores equal)                        100.00      n/a",
        "Flat      n/a (one pair)  n/a (all gold scores equal)  n/a (all model scores equal)      n/a",
    ]
    report = (tmp_path / "ev" / "report.md").read_text()
    assert "| Lookup | n/a (one pair) | n/a (all gold scores equal) | 100.00 | n/a |" in report
    assert "| Flat | n/a (one pair) | n/a (all gold scores equal) | n/a (all model scores equal) | n/a |" in report


def test_a_budget_sweep_over_sets_of_one_pair_draws_its_frontier_without_a_dense_line(toy, tmp_path):
    """Every STS set n/a (one pair): the frontier has no dense average to draw, and numpy's "Mean of empty slice"
    warnings no longer precede the table."""
    import warnings

    cfg = EvaluateConfig(tasks=["sts"], sts=[write_sts(tmp_path / "one.tsv", [("A man plays.", "A man plays a guitar.", 4)])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        results = evaluate_model({"toy": toy}, cfg, str(tmp_path / "ev"), print_table=False)
    assert "budget" in results["sweeps"]["toy"] and results["scores"]["sts"]["toy"] == {"one": None}
    assert (tmp_path / "ev" / "frontier_toy.png").stat().st_size > 0


def write_beir(folder, qrels: str):
    """corpus d1 ("alpha"), d2 ("beta"), n ("noise"); queries q1 ("alpha"), q2 ("beta"); qrels/test.tsv as given."""
    (folder / "qrels").mkdir(parents=True)
    corpus = [("d1", "alpha"), ("d2", "beta"), ("n", "noise")]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in (("q1", "alpha"), ("q2", "beta"))))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return str(folder)


BEIR_VECTORS = {"alpha": [1, 0, 0], "beta": [0, 1, 0], "noise": [0, 0, 1]}


def test_qrels_naming_documents_the_corpus_lacks_are_counted_and_said_once(tmp_path, caplog):
    """q2's relevant "gone" is not in the corpus: it counted as not retrieved (q2's nDCG 1 / (1 + 1/log2 3)), silently."""
    folder = write_beir(tmp_path / "mini", "q1\td1\t1\nq2\td2\t1\nq2\tgone\t1\nq2\tn\t0\n")  # n: judged not relevant
    cfg = EvaluateConfig(tasks=["retrieval"], retrieval=[folder], baselines=[])
    with caplog.at_level(logging.WARNING, logger="cqg_ray"):
        results = evaluate_model({"Lookup": Lookup(BEIR_VECTORS)}, cfg, str(tmp_path / "ev"), print_table=False)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cqg_ray")]
    assert said == [f"{folder}: qrels name 1 relevant document that is not in the corpus (of 3): they count as not retrieved"]
    assert results["scores"]["retrieval"]["Lookup"]["mini"] == pytest.approx(100 * (1 + 1 / (1 + 1 / math.log2(3))) / 2, abs=1e-9)
    info = json.loads((tmp_path / "ev" / "results.json").read_text())["datasets"]["retrieval"]["mini"]
    assert (info["qrels_docs"], info["qrels_docs_missing"]) == (3, 1)
    assert ("- mini: qrels name 1 relevant document that is not in the corpus (of 3): they count as not retrieved."
            in (tmp_path / "ev" / "report.md").read_text().splitlines())
    d = load_beir(write_beir(tmp_path / "two", "q1\tx\t1\nq2\td2\t1\nq2\ty\t2\n"))
    assert (d.qrels_docs, d.qrels_docs_missing) == (3, 2)
    assert caplog.records[-1].getMessage().endswith("qrels name 2 relevant documents that are not in the corpus (of 3): they count as not retrieved")
    assert (load_beir(write_beir(tmp_path / "whole", "q1\td1\t1\n")).qrels_docs_missing) == 0


def test_qrels_naming_no_document_of_the_corpus_is_a_data_error(tmp_path, capsys):
    """Every query scored 0.00, as if the model had ranked badly (e.g. qrels with ids of another corpus version)."""
    from cqg_ray.cli import main
    from cqg_ray.mbqa.toy import build_toy_model

    folder = write_beir(tmp_path / "mini", "q1\t101\t1\nq2\t102\t1\nq2\td1\t0\n")
    says = (f"{folder}: none of the 2 relevant documents that qrels/test.tsv names is in corpus.jsonl (qrels name e.g. "
            "['101', '102'], the corpus has e.g. ['d1', 'd2', 'n'])")
    with pytest.raises(DataError) as e:
        load_beir(folder)
    assert str(e.value) == says
    toy = build_toy_model(str(tmp_path / "toy"))
    assert main(["evaluate", toy, "--tasks", "retrieval", "--retrieval", folder, "--out", str(tmp_path / "ev")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {says}"
    assert not (tmp_path / "ev").exists()


def test_an_interrupted_report_write_leaves_no_results_json_beside_files_of_another_evaluation(tmp_path, monkeypatch):
    """Each file was written atomically, results.json first: a write killed before report.md left the new results.json
    beside the old report.md."""
    from cqg_ray.rundir import RunDir

    files = [write_sts(tmp_path / "ok.tsv", [("a", "a", 3), ("a", "b", 2), ("a", "c", 1)])]
    out = tmp_path / "ev"
    first = evaluate_model({"Lookup": Lookup(STS_VECTORS)}, EvaluateConfig(tasks=["sts"], sts=files, baselines=[]), str(out),
                           print_table=False)
    assert (out / "report.md").read_text() == render_markdown(json.loads((out / "results.json").read_text()))  # made from it
    second = {**first, "scores": {"sts": {"Lookup": {"ok": 12.5}}}}
    real = RunDir.write_bytes

    def killed_at(name):
        def write_bytes(self, rel, data):
            if rel == name:
                raise KeyboardInterrupt
            real(self, rel, data)
        return write_bytes

    for name in ("report.md", "results.json"):
        monkeypatch.setattr(RunDir, "write_bytes", killed_at(name))
        with pytest.raises(KeyboardInterrupt):
            write_report(second, str(out))
        assert sorted(p.name for p in out.iterdir()) == (["report.md"] if name == "results.json" else [])
    monkeypatch.setattr(RunDir, "write_bytes", real)
    write_report(second, str(out))
    assert json.loads((out / "results.json").read_text())["scores"] == {"sts": {"Lookup": {"ok": 12.5}}}
    assert "| Lookup | 12.50 |" in (out / "report.md").read_text()
