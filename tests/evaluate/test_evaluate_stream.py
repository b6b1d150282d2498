"""Evaluation streams its corpora (issue 31, item 3): retrieval keeps each query's running top k while the corpus is
embedded a batch at a time, clustering keeps sparse budgeted rows, and neither holds a corpus's n x m probabilities.
The streamed scores and budget-sweep points equal those of today's whole-set computation (the pre-streaming
``top_k_cosine`` is copied below as the reference), on a small set with tiny batches. No Ray, no sentence encoder."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import scipy.sparse as sp

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate import tasks
from cqg_ray.evaluate.data import ClusteringData, RetrievalData
from cqg_ray.evaluate.methods import Method
from cqg_ray.evaluate.metrics import CosineTopK, kmeans_v_measure, l2_normalize, top_k_cosine
from cqg_ray.evaluate.models import budgeted, model_budget
from cqg_ray.evaluate.report import evaluate_model
from cqg_ray.evaluate.sweeps import budget_curves
from cqg_ray.mbqa.budget import Budget, apply_budget
from cqg_ray.ranking import top_k


def old_top_k_cosine(Q, D, k=10, query_batch=1024, doc_batch=65536):
    """``metrics.top_k_cosine`` as it was before the corpus streamed (commit f7aa751), verbatim."""
    n_q, n_d = Q.shape[0], D.shape[0]
    k = min(k, n_d)
    best_s = np.full((n_q, 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((n_q, 0), dtype=np.int64)
    out_s, out_i = [], []
    for q0 in range(0, n_q, query_batch):
        Qn = l2_normalize(Q[q0 : q0 + query_batch])
        bs, bi = best_s[q0 : q0 + query_batch], best_i[q0 : q0 + query_batch]
        for d0 in range(0, n_d, doc_batch):
            Dn = l2_normalize(D[d0 : d0 + doc_batch])
            s = Qn @ Dn.T
            s = np.asarray(s.toarray() if sp.issparse(s) else s, dtype=np.float32)
            ids = np.broadcast_to(np.arange(d0, d0 + s.shape[1], dtype=np.int64), s.shape)
            cs, ci = top_k(s, k, ids)
            bs, bi = top_k(np.concatenate([bs, cs], axis=1), k, np.concatenate([bi, ci], axis=1))
        out_s.append(bs)
        out_i.append(bi)
    return np.concatenate(out_s), np.concatenate(out_i)


def old_retrieval_score(Q, D, data, k=10):
    return tasks.ranked_ndcg(old_top_k_cosine(Q, D, k=k + 1)[1], data, k)


def _vec(text: str, d: int) -> np.ndarray:
    seed = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(d).astype(np.float32)


class HashEncoder:
    """A black-box Encoder: a fixed random vector per text (so a text's vector never depends on its batch)."""

    def __init__(self, d: int = 12):
        self.d, self.calls = d, []

    def encode(self, texts, **kwargs) -> np.ndarray:
        self.calls.append(len(texts))
        return np.stack([_vec(t, self.d) for t in texts]) if texts else np.zeros((0, self.d), np.float32)


class HashModel:
    """An interpretable stand-in: m questions, P(yes) = sigmoid(2 z - 1) of a random projection of the text's vector;
    with question means, so the budget sweep has all four rules (centred values, ranked by p - mean)."""

    def __init__(self, m: int = 24, d: int = 12, tau: float = 0.5):
        rng = np.random.default_rng(7)
        self.W = rng.standard_normal((d, m)).astype(np.float32) / np.sqrt(d)
        self.d, self.tau = d, tau
        self.questions = [f"q{i}?" for i in range(m)]
        self.mean = rng.uniform(0.2, 0.6, m).astype(np.float32)
        self.calls: list[int] = []

    def apply(self, probs, budget=None):
        """(active, values) under a budget (default: the tau rule), with the question means, as the embedder's."""
        return apply_budget(probs, budget or Budget(rule="tau", tau=self.tau), self.mean)

    def encode(self, texts, output: str = "bits", threshold: float | None = None) -> np.ndarray:
        self.calls.append(len(texts))
        e = np.stack([_vec(t, self.d) for t in texts])
        p = (1.0 / (1.0 + np.exp(-(2.0 * (e @ self.W) - 1.0)))).astype(np.float32)
        return p if output == "probs" else (p > (self.tau if threshold is None else threshold)).astype(np.uint8)


def retrieval_set(n_docs=150, n_queries=40, seed=0) -> RetrievalData:
    rng = np.random.default_rng(seed)
    doc_ids = [f"d{i}" for i in range(n_docs)]
    query_ids = [f"q{i}" for i in range(n_queries)]
    query_ids[:3] = ["d5", "d17", "d40"]  # queries that are also documents (dropped from their own ranking)
    qrels = {q: {doc_ids[j]: int(rng.integers(1, 3)) for j in rng.choice(n_docs, size=int(rng.integers(1, 4)), replace=False)}
             for q in query_ids}
    return RetrievalData("mini", "mem", doc_ids, [f"document {i} about {i % 7}" for i in range(n_docs)],
                         query_ids, [f"query {q}" for q in query_ids], qrels, full_corpus=True)


def clustering_set(n=120) -> ClusteringData:
    return ClusteringData("mini-c", "mem", [f"text {i} group {i % 4}" for i in range(n)], [f"g{i % 4}" for i in range(n)])


def curves_for(model, ks=(2, 4, 8)):
    return budget_curves(model_budget(model), list(ks), True)


def dot_rounding(n: int, dtype=np.float32) -> float:
    """How far two summation orders of an n-term dot product of unit vectors may differ: 2 gamma_n, where
    |fl(x.y) - x.y| <= gamma_n |x|.|y| and gamma_n = n u / (1 - n u), u the unit roundoff (Higham, Accuracy and
    Stability of Numerical Algorithms, eq. 3.5). BLAS kernels sum in an order of their own, per CPU and matrix shape."""
    u = np.finfo(dtype).eps / 2
    return 2 * n * u / (1 - n * u)


def test_cosine_top_k_fed_in_chunks_equals_the_whole_corpus_top_k():
    rng = np.random.default_rng(1)
    Q, D = rng.standard_normal((30, 16)).astype(np.float32), rng.standard_normal((200, 16)).astype(np.float32)
    bits_q, bits_d = (Q > 0.8).astype(np.uint8), (D > 0.8).astype(np.uint8)  # 0/1 vectors: many exact ties
    tol = dot_rounding(Q.shape[1])  # 1.9e-6 for 16 dimensions
    for q, d in ((Q, D), (bits_q, bits_d), (sp.csr_matrix(bits_q), sp.csr_matrix(bits_d))):
        ref_s, ref_i = old_top_k_cosine(q, d, k=11)
        for chunk in (1, 7, 64, 200, 1000):
            acc = CosineTopK(q, k=11, query_batch=8)
            for d0 in range(0, d.shape[0], chunk):
                acc.add(d[d0 : d0 + chunk])
            s, i = acc.result()
            # the same documents; the scores to the dot products' rounding (a 1-row chunk, a block of 8 queries and
            # one of 30 go through different BLAS kernels, which sum in different orders)
            assert np.array_equal(i, ref_i) and np.abs(s - ref_s).max() <= tol, chunk
        s, i = top_k_cosine(q, d, k=11, query_batch=5, doc_batch=9)
        assert np.array_equal(i, ref_i) and np.abs(s - ref_s).max() <= tol
    acc = CosineTopK(Q, k=3)
    assert acc.result()[1].shape == (30, 0)  # no documents yet
    with pytest.raises(ValueError, match="dimensions"):
        acc.add(np.zeros((2, 5)))


def test_streamed_retrieval_equals_the_whole_corpus_scores_and_sweep():
    d, model, enc = retrieval_set(), HashModel(), HashEncoder()
    methods = [Method("M", "interpretable", model), Method("Hash", "encoder", enc)]
    curves = {"M": curves_for(model)}
    assert len(curves["M"]) == 5  # 0/1, probability, centred; centred by p - mean; probability by p - 0.5 mean

    out = tasks.score_retrieval(d, methods, curves, doc_batch=7)
    assert max(model.calls[1:]) == 7 and sum(model.calls[1:]) == 150  # the corpus in batches of 7, never whole
    assert max(enc.calls[1:]) == 7

    pq_, pd_ = model.encode(d.queries, output="probs"), model.encode(d.docs, output="probs")
    ref = old_retrieval_score(budgeted(model, pq_), budgeted(model, pd_), d)
    assert out["M"].scores["retrieval"] == pytest.approx(ref, abs=1e-6)
    assert out["M"].scores["retrieval"] == ref  # in fact exactly
    for rule, budgets in curves["M"].items():
        want = [old_retrieval_score(budgeted(model, pq_, b), budgeted(model, pd_, b), d) for b in budgets]
        assert out["M"].sweep[rule] == pytest.approx(want, abs=1e-6), rule
        assert out["M"].sweep[rule] == want
    assert out["Hash"].scores["retrieval"] == old_retrieval_score(enc.encode(d.queries), enc.encode(d.docs), d)
    assert out["Hash"].sweep is None and out["M"].sts_probs is None
    assert 0 < ref < 100  # a set where the ranking matters

    whole = tasks.score_retrieval(d, methods, curves)  # the default batch holds the whole small corpus
    assert whole["M"].scores == out["M"].scores and whole["M"].sweep == out["M"].sweep


def test_streamed_clustering_equals_the_whole_set_scores_and_sweep():
    d, model, enc = clustering_set(), HashModel(), HashEncoder()
    methods = [Method("M", "interpretable", model), Method("Hash", "encoder", enc)]
    curves = {"M": curves_for(model, ks=(2, 6))}
    out = tasks.score_clustering(d, methods, curves, batch=13)
    assert max(model.calls) == 13

    probs = model.encode(d.texts, output="probs")
    assert out["M"].scores["clustering"] == pytest.approx(kmeans_v_measure(budgeted(model, probs), d.labels), abs=1e-6)
    for rule, budgets in curves["M"].items():
        want = [kmeans_v_measure(budgeted(model, probs, b), d.labels) for b in budgets]
        assert out["M"].sweep[rule] == pytest.approx(want, abs=1e-6), rule
    assert out["Hash"].scores["clustering"] == pytest.approx(kmeans_v_measure(enc.encode(d.texts), d.labels), abs=1e-6)


def test_evaluate_model_streams_retrieval_and_clustering(tmp_path, monkeypatch):
    """The whole evaluation (report) with batches of 7 texts: the tables and the budget sweep's retrieval and
    clustering points equal today's whole-set formulas."""
    d, c = retrieval_set(), clustering_set()
    beir = tmp_path / "mini"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in zip(d.doc_ids, d.docs)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(d.query_ids, d.queries)))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{doc}\t{r}\n" for q, rel in d.qrels.items() for doc, r in rel.items()))
    clus = tmp_path / "mini-c.jsonl"
    clus.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in zip(c.texts, c.labels)))
    model = HashModel()
    cfg = EvaluateConfig(tasks=["retrieval", "clustering"], retrieval=[str(beir)], clustering=[str(clus)], baselines=[], active_k=[2, 4])
    monkeypatch.setattr(tasks, "DOC_BATCH", 7)
    res = evaluate_model({"M": model}, cfg, None, print_table=False)
    assert model.calls[0] == 40 and max(model.calls[1:]) == 7  # the queries at once, then the texts 7 at a time

    loaded = tasks.load_datasets(cfg)
    rd, cd = loaded["retrieval"][0], loaded["clustering"][0]
    pq_, pd_ = model.encode(rd.queries, output="probs"), model.encode(rd.docs, output="probs")
    pc = model.encode(cd.texts, output="probs")
    assert res["scores"]["retrieval"]["M"][rd.name] == pytest.approx(old_retrieval_score(budgeted(model, pq_), budgeted(model, pd_), rd), abs=1e-6)
    assert res["scores"]["clustering"]["M"][cd.name] == pytest.approx(kmeans_v_measure(budgeted(model, pc), cd.labels), abs=1e-6)
    rules = res["sweeps"]["M"]["budget"]["rules"]
    for rule, budgets in curves_for(model, ks=(2, 4)).items():
        assert rules[rule]["retrieval"][rd.name] == pytest.approx(
            [old_retrieval_score(budgeted(model, pq_, b), budgeted(model, pd_, b), rd) for b in budgets], abs=1e-6)
        assert rules[rule]["clustering"][cd.name] == pytest.approx([kmeans_v_measure(budgeted(model, pc, b), cd.labels) for b in budgets], abs=1e-6)
