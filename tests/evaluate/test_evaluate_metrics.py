"""Metrics: hand-computed cases, and cross-checks against scipy, scikit-learn and pytrec_eval."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import spearmanr

from cqg_ray.evaluate.metrics import (
    cognitive_load,
    cognitive_load_pairs,
    cosine_pairs,
    kmeans_v_measure,
    l2_normalize,
    ndcg_at_k,
    ndcg_per_query,
    ranking_from_indices,
    spearman,
    sts_spearman,
    top_k_cosine,
)

# ----------------------------------------------------------------------------------------- cosine / STS


def test_cosine_pairs_hand_case_dense_binary_sparse():
    A = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=np.uint8)
    B = np.array([[1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=np.uint8)
    expected = np.array([1.0, 1 / math.sqrt(2), 0.0, 2 / (math.sqrt(3) * math.sqrt(2))])
    np.testing.assert_allclose(cosine_pairs(A, B), expected, rtol=1e-12)
    np.testing.assert_allclose(cosine_pairs(sp.csr_matrix(A), sp.csr_matrix(B)), expected, rtol=1e-12)
    np.testing.assert_allclose(cosine_pairs(A.astype(np.float32) * 3, B.astype(np.float32)), expected, rtol=1e-6)


def test_cosine_of_binary_vectors_keeps_mathematical_ties_exact():
    # 1/sqrt(2) four ways: 1/sqrt(1*2), 2/sqrt(2*4), 3/sqrt(3*6), 5/sqrt(5*10)
    A = np.zeros((4, 10), dtype=np.uint8)
    B = np.zeros((4, 10), dtype=np.uint8)
    for r, k in enumerate([1, 2, 3, 5]):
        A[r, :k] = 1
        B[r, : 2 * k] = 1
    cos = cosine_pairs(A, B)
    assert len(set(cos.tolist())) == 1 and cos[0] == pytest.approx(2**-0.5, abs=1e-15)
    assert len(set(cosine_pairs(sp.csr_matrix(A), sp.csr_matrix(B)).tolist())) == 1


def test_l2_normalize_keeps_zero_rows_zero():
    X = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(l2_normalize(X), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(l2_normalize(sp.csr_matrix(X)).toarray(), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)


def test_sts_spearman_hand_case():
    # cosines: 1, 0.7071, 0 ; gold 5, 3, 0 -> identical ranks -> rho = 1
    E1 = np.array([[1, 0], [1, 1], [1, 0]], dtype=np.uint8)
    E2 = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.uint8)
    assert sts_spearman(E1, E2, np.array([5.0, 3.0, 0.0])) == 100.0
    assert sts_spearman(E1, E2, np.array([0.0, 3.0, 5.0])) == -100.0


def test_sts_spearman_matches_scipy_on_random_embeddings():
    rng = np.random.default_rng(0)
    E1, E2 = rng.normal(size=(300, 16)), rng.normal(size=(300, 16))
    gold = rng.uniform(0, 5, size=300)
    cos = np.array([a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in zip(E1, E2)])
    assert sts_spearman(E1, E2, gold) == pytest.approx(100 * spearmanr(cos, gold).statistic, abs=1e-9)


def test_spearman_with_ties_matches_scipy_and_constant_is_nan():
    x = np.array([1, 1, 2, 3, 3, 3, 4.0])
    y = np.array([2, 1, 2, 5, 4, 4, 9.0])
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert math.isnan(spearman(np.ones(5), np.arange(5.0)))


# ----------------------------------------------------------------------------------------- cognitive load (Eq. 5)


def test_cognitive_load_hand_case():
    U = np.array([[1, 1, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]], dtype=np.uint8)
    V = np.array([[1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=np.uint8)
    np.testing.assert_array_equal(cognitive_load_pairs(U, V), [2.0, 2.0, 0.0])
    assert cognitive_load(U, V) == pytest.approx(4 / 3)
    assert cognitive_load(sp.csr_matrix(U), sp.csr_matrix(V)) == pytest.approx(4 / 3)


def test_cognitive_load_counts_shared_nonzero_values():
    U = np.array([[0.3, 1.0, 0.0, -0.2], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    V = np.array([[0.9, 0.0, 0.5, 0.1], [0.4, 0.4, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(cognitive_load_pairs(U, V), [2.0, 0.0])
    assert cognitive_load(sp.csr_array(U), sp.csr_array(V)) == 1.0


# ----------------------------------------------------------------------------------------- top-k retrieval


def _brute_top_k(Q, D, k):
    """Reference: full cosine matrix, sorted by (score desc, index asc)."""
    Qd = Q.toarray() if sp.issparse(Q) else np.asarray(Q, dtype=np.float64)
    Dd = D.toarray() if sp.issparse(D) else np.asarray(D, dtype=np.float64)
    qn = np.linalg.norm(Qd, axis=1, keepdims=True)
    dn = np.linalg.norm(Dd, axis=1, keepdims=True)
    S = (Qd / np.where(qn > 0, qn, 1)) @ (Dd / np.where(dn > 0, dn, 1)).T
    S = S.astype(np.float32)
    idx = np.array([np.lexsort((np.arange(S.shape[1]), -row))[:k] for row in S])
    return np.take_along_axis(S, idx, axis=1), idx


def test_top_k_cosine_dense_matches_brute_force_across_chunks():
    rng = np.random.default_rng(1)
    Q, D = rng.normal(size=(23, 8)), rng.normal(size=(101, 8))
    s, i = top_k_cosine(Q, D, k=10, query_batch=4, doc_batch=7)
    bs, bi = _brute_top_k(Q, D, 10)
    np.testing.assert_array_equal(i, bi)
    np.testing.assert_allclose(s, bs, rtol=1e-5, atol=1e-6)


def test_top_k_cosine_binary_ties_prefer_earlier_documents():
    rng = np.random.default_rng(2)
    Q = (rng.random((17, 6)) < 0.4).astype(np.uint8)
    D = (rng.random((200, 6)) < 0.4).astype(np.uint8)  # 6 bits: massive ties
    Q[0] = 0  # an all-zero query ties with every document at 0
    s, i = top_k_cosine(Q, D, k=10, query_batch=5, doc_batch=32)
    bs, bi = _brute_top_k(Q, D, 10)
    np.testing.assert_array_equal(i, bi)
    np.testing.assert_array_equal(i[0], np.arange(10))
    s2, i2 = top_k_cosine(sp.csr_matrix(Q), sp.csr_matrix(D), k=10, doc_batch=64)
    np.testing.assert_array_equal(i2, bi)


def test_top_k_cosine_k_larger_than_corpus_and_dimension_mismatch():
    s, i = top_k_cosine(np.eye(2), np.eye(2)[:1], k=10)
    assert i.shape == (2, 1)
    with pytest.raises(ValueError, match="dimensions"):
        top_k_cosine(np.eye(2), np.eye(3), k=1)


# ----------------------------------------------------------------------------------------- nDCG


def test_ndcg_hand_case():
    qrels = {"q1": {"a": 1, "b": 2}, "q2": {"c": 1}, "q3": {"d": 0}}
    ranked = {"q1": ["b", "x", "a"], "q2": ["y", "z"]}
    per = ndcg_per_query(ranked, qrels, k=10)
    dcg = 2 / math.log2(2) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert per["q1"] == pytest.approx(dcg / idcg, abs=1e-12)
    assert per["q2"] == 0.0 and per["q3"] == 0.0  # relevant doc not retrieved; no positive judgement
    assert ndcg_at_k(ranked, qrels, k=10) == pytest.approx(100 * (dcg / idcg) / 3, abs=1e-9)
    # the cut-off: the relevant document at rank 3 does not count at k=2
    assert ndcg_per_query(ranked, qrels, k=2)["q1"] == pytest.approx(2.0 / (2 + 1 / math.log2(3)), abs=1e-12)


def _random_retrieval(seed, n_q=30, n_d=80):
    rng = np.random.default_rng(seed)
    doc_ids = [f"d{j}" for j in range(n_d)]
    qrels = {}
    for q in range(n_q):
        rel = rng.choice(n_d, size=rng.integers(1, 6), replace=False)
        qrels[f"q{q}"] = {doc_ids[j]: int(rng.integers(0, 3)) for j in rel}
    scores = rng.permutation(n_q * n_d).reshape(n_q, n_d).astype(np.float64)  # distinct scores: no ties
    return doc_ids, qrels, scores


def test_ndcg_matches_sklearn_ndcg_score():
    from sklearn.metrics import ndcg_score

    doc_ids, qrels, scores = _random_retrieval(3)
    idx = np.argsort(-scores, axis=1)[:, :10]
    ours = ndcg_per_query(ranking_from_indices(list(qrels), doc_ids, idx), qrels, k=10)
    for r, (q, judged) in enumerate(qrels.items()):
        y_true = np.array([[judged.get(d, 0) for d in doc_ids]])
        if y_true.sum() == 0:
            assert ours[q] == 0.0
            continue
        assert ours[q] == pytest.approx(ndcg_score(y_true, scores[r : r + 1], k=10), abs=1e-12)


def test_ndcg_matches_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    doc_ids, qrels, scores = _random_retrieval(4)
    idx = np.argsort(-scores, axis=1)[:, :10]
    run = {q: {doc_ids[j]: float(scores[r, j]) for j in idx[r]} for r, q in enumerate(qrels)}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    ours = ndcg_per_query(ranking_from_indices(list(qrels), doc_ids, idx), qrels, k=10)
    for q in qrels:
        assert ours[q] == pytest.approx(ref[q]["ndcg_cut_10"], abs=1e-6)  # trec_eval prints 4 decimals, keeps doubles


# ----------------------------------------------------------------------------------------- clustering


def test_kmeans_v_measure_separated_blobs_is_perfect():
    rng = np.random.default_rng(5)
    centers = np.array([[10, 0, 0], [0, 10, 0], [0, 0, 10]], dtype=np.float64)
    X = np.concatenate([c + rng.normal(scale=0.1, size=(40, 3)) for c in centers])
    labels = ["a"] * 40 + ["b"] * 40 + ["c"] * 40
    assert kmeans_v_measure(X, labels) == pytest.approx(100.0)
    assert kmeans_v_measure(sp.csr_matrix(X), labels) == pytest.approx(100.0)


def test_kmeans_v_measure_follows_mteb_protocol_exactly():
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import v_measure_score

    rng = np.random.default_rng(6)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    labels = list(rng.integers(0, 5, size=300))
    km = MiniBatchKMeans(n_clusters=5, batch_size=500, n_init="auto", random_state=42).fit(X)
    assert kmeans_v_measure(X, labels) == pytest.approx(100 * v_measure_score(labels, km.labels_), abs=1e-12)


def test_kmeans_v_measure_bad_input():
    with pytest.raises(ValueError, match="two distinct labels"):
        kmeans_v_measure(np.zeros((3, 2)), ["a", "a", "a"])
    with pytest.raises(ValueError, match="labels"):
        kmeans_v_measure(np.zeros((3, 2)), ["a", "b"])
