"""What the report says of a set it cannot score as asked: an STS file whose Spearman is undefined (one pair, equal
gold scores, equal model scores) says why beside its n/a."""

import json

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.report import evaluate_model, format_tables

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
