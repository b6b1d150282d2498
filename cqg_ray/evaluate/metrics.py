"""Evaluation metrics (pure numpy / scipy / scikit-learn): arrays in, numbers out.

Embeddings may be dense float arrays, binary 0/1 arrays (uint8 / bool, the interpretable model's output at
threshold tau) or scipy sparse matrices (Bag-of-Tokens). Cosine similarity treats 0/1 vectors as real vectors:
cos(u, v) = <u, v> / (|u| |v|); a vector with no 1s (or all zeros) has similarity 0 with everything.

Task scores are on the paper's scale (x100):
- ``sts_spearman``: 100 x Spearman's rho between cosine(e1, e2) and the gold scores (paper Table 1).
- ``ndcg_at_k``: 100 x mean nDCG@k over the judged queries, ranking the full corpus by cosine (Table 2).
  Gains are the graded relevances, discount 1/log2(rank + 1), the ideal ranking built from all judged
  documents of the query (trec_eval's ``ndcg_cut``, which BEIR and MTEB call through pytrec_eval). A retrieved
  document whose id is the query's own is dropped first where asked (``ranking_from_indices(drop_identical=True)``).
  The ranking needs only each query's top k: ``CosineTopK`` keeps them while the corpus streams past in chunks.
- ``kmeans_v_measure``: 100 x V-measure of MiniBatchKMeans with the true number of labels, batch 500,
  ``n_init="auto"``, random_state 42: MTEB's clustering protocol and default seed (Table 3).
- ``cognitive_load``: paper Eq. 5, the mean over text pairs of <u, v> = sum_i u_i v_i for binary u, v,
  i.e. the number of questions answered "yes" for both texts (Table 4). Not scaled.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
from scipy.stats import spearmanr

from cqg_ray.ranking import top_k

Matrix = np.ndarray | sp.spmatrix | sp.sparray


def as_float(X: Matrix) -> Matrix:
    """float32 copy-free where possible; sparse stays sparse (CSR)."""
    if sp.issparse(X):
        return sp.csr_matrix(X, dtype=np.float32)
    return np.asarray(X, dtype=np.float32)


def l2_normalize(X: Matrix) -> Matrix:
    """Rows scaled to unit length (float32); all-zero rows stay zero."""
    X = as_float(X)
    if sp.issparse(X):
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel())
    else:
        norms = np.sqrt(np.einsum("ij,ij->i", X, X).astype(np.float64))
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0).astype(np.float32)
    if sp.issparse(X):
        return sp.csr_matrix(sp.diags(inv) @ X)
    return X * inv[:, None]


def row_dots(A: Matrix, B: Matrix) -> np.ndarray:
    """<A[i], B[i]> for each row i (float64)."""
    if A.shape != B.shape:
        raise ValueError(f"row_dots needs equal shapes, got {A.shape} and {B.shape}")
    if sp.issparse(A) or sp.issparse(B):
        A, B = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
        return np.asarray(A.multiply(B).sum(axis=1)).ravel()
    return np.einsum("ij,ij->i", np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64))


def cosine_pairs(A: Matrix, B: Matrix) -> np.ndarray:
    """cos(A[i], B[i]) for each row i; 0 where either row is all zeros.

    Computed as sign(d) sqrt(d^2 / (|a|^2 |b|^2)): for 0/1 (integer) vectors every quantity under the root is an
    exact integer ratio, so pairs with mathematically equal cosines get bit-identical values and Spearman sees
    them as the ties they are (dot / (|a| |b|) with two rounded square roots can split such ties)."""
    dots = row_dots(A, B)
    sq = row_dots(A, A) * row_dots(B, B)
    ratio = np.divide(dots * dots, sq, out=np.zeros(A.shape[0]), where=sq > 0)
    return np.sign(dots) * np.sqrt(ratio)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (ties get average ranks); NaN when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(x, y).statistic)


def sts_spearman(E1: Matrix, E2: Matrix, gold: np.ndarray) -> float:
    """100 x Spearman's rho between cos(E1[i], E2[i]) and gold[i] (the paper's STS metric)."""
    return 100.0 * spearman(cosine_pairs(E1, E2), gold)


def sts_na_reason(E1: Matrix, E2: Matrix, gold: np.ndarray) -> str | None:
    """Why ``sts_spearman`` of these pairs is undefined (NaN, n/a in the report), or None where it is defined: one
    pair, every gold score equal, or every similarity the embeddings give equal (e.g. all-zero vectors)."""
    gold = np.asarray(gold, dtype=np.float64)
    if len(gold) < 2:
        return "one pair"
    if np.ptp(gold) == 0:
        return "all gold scores equal"
    if np.ptp(cosine_pairs(E1, E2)) == 0:
        return "all model scores equal"
    return None


def cognitive_load_pairs(U: Matrix, V: Matrix) -> np.ndarray:
    """The number of dimensions nonzero in both u_i and v_i, per pair: <u_i, v_i> of binary embeddings (paper Eq. 5),
    and the count of active questions two texts share for budgeted (valued) ones."""
    def nonzero(X: Matrix) -> Matrix:
        if sp.issparse(X):
            X = sp.csr_array(X, copy=True)
            X.eliminate_zeros()
            X.data = np.ones_like(X.data, dtype=np.float32)
            return X
        return (np.asarray(X) != 0).astype(np.float32)

    return row_dots(nonzero(U), nonzero(V))


def cognitive_load(U: Matrix, V: Matrix) -> float:
    """Paper Eq. 5 averaged over pairs: mean number of dimensions that are nonzero (1) in both embeddings."""
    return float(cognitive_load_pairs(U, V).mean())


# ----------------------------------------------------------------------------------------- retrieval


class CosineTopK:
    """Exact top-k documents by cosine for every query, fed the corpus a chunk at a time: only the queries (normalised,
    float32) and the running best k scores and document indices per query are held, never a score matrix of the
    whole corpus nor the corpus itself. ``add(D_chunk)`` takes the next documents (dense, binary or sparse; numbered
    in the order added), ``result()`` gives (scores, doc_indices), both (n_q, min(k, documents added)), best first;
    ties are broken by the lower document index. Scores are computed per (query batch, document chunk) exactly as
    ``top_k_cosine`` computes them, which is this class over chunks of D.
    """

    def __init__(self, Q: Matrix, k: int = 10, query_batch: int = 1024):
        self.k, self.dims, self.n_docs = k, Q.shape[1], 0
        self.queries = [l2_normalize(Q[q0 : q0 + query_batch]) for q0 in range(0, Q.shape[0], query_batch)]
        self.best = [(np.full((q.shape[0], 0), -np.inf, dtype=np.float32), np.zeros((q.shape[0], 0), dtype=np.int64))
                     for q in self.queries]

    def add(self, D: Matrix) -> None:
        if D.shape[1] != self.dims:
            raise ValueError(f"queries have {self.dims} dimensions, documents {D.shape[1]}")
        d0 = self.n_docs
        Dn = l2_normalize(D)
        for j, Qn in enumerate(self.queries):
            s = Qn @ Dn.T
            s = np.asarray(s.toarray() if sp.issparse(s) else s, dtype=np.float32)
            ids = np.broadcast_to(np.arange(d0, d0 + s.shape[1], dtype=np.int64), s.shape)
            cs, ci = top_k(s, self.k, ids)
            bs, bi = self.best[j]
            self.best[j] = top_k(np.concatenate([bs, cs], axis=1), self.k, np.concatenate([bi, ci], axis=1))
        self.n_docs += D.shape[0]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.best:
            return np.zeros((0, 0), dtype=np.float32), np.zeros((0, 0), dtype=np.int64)
        return np.concatenate([b[0] for b in self.best]), np.concatenate([b[1] for b in self.best])


def top_k_cosine(
    Q: Matrix,
    D: Matrix,
    k: int = 10,
    query_batch: int = 1024,
    doc_batch: int = 65536,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k documents by cosine for every query, in chunked matrix products (``CosineTopK`` over D's chunks).

    Q (n_q, m) and D (n_d, m) may be dense, binary or sparse; D is converted to float one chunk at a time,
    so a large binary corpus is never held as float. Returns (scores, doc_indices), both (n_q, min(k, n_d)),
    best first; ties are broken by the lower document index.
    """
    if Q.shape[1] != D.shape[1]:
        raise ValueError(f"queries have {Q.shape[1]} dimensions, documents {D.shape[1]}")
    acc = CosineTopK(Q, k, query_batch)
    for d0 in range(0, D.shape[0], doc_batch):
        acc.add(D[d0 : d0 + doc_batch])
    return acc.result()


def ndcg_per_query(ranked: dict[str, list[str]], qrels: dict[str, dict[str, int]], k: int = 10) -> dict[str, float]:
    """nDCG@k of each judged query (trec_eval ``ndcg_cut``): sum rel_i / log2(i + 1) over the top k,
    divided by the same sum over the ideal order of the query's judged relevances. A judged query with
    no ranking, or with no positive judgement, scores 0."""
    out = {}
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    for qid, judged in qrels.items():
        ideal = np.sort(np.array([max(r, 0) for r in judged.values()], dtype=np.float64))[::-1][:k]
        idcg = float((ideal * discounts[: len(ideal)]).sum())
        gains = np.array([max(judged.get(d, 0), 0) for d in ranked.get(qid, [])[:k]], dtype=np.float64)
        dcg = float((gains * discounts[: len(gains)]).sum())
        out[qid] = dcg / idcg if idcg > 0 else 0.0
    return out


def ndcg_at_k(ranked: dict[str, list[str]], qrels: dict[str, dict[str, int]], k: int = 10) -> float:
    """100 x mean nDCG@k over the judged queries."""
    per = ndcg_per_query(ranked, qrels, k)
    return 100.0 * float(np.mean(list(per.values()))) if per else float("nan")


def ranking_from_indices(
    query_ids: list[str], doc_ids: list[str], idx: np.ndarray, k: int | None = None, drop_identical: bool = False
) -> dict[str, list[str]]:
    """{query id: document ids, best first} from top-k indices, cut to the first k.

    ``drop_identical``: leave out the document whose id equals the query id (BEIR's ``ignore_identical_ids``);
    retrieve k + 1 per query so that k remain. The result equals masking that document before the top-k."""
    out = {}
    for q, row in zip(query_ids, idx):
        ranked = [doc_ids[j] for j in row]
        if drop_identical:
            ranked = [d for d in ranked if d != q]
        out[q] = ranked[:k]
    return out


# ----------------------------------------------------------------------------------------- clustering


MTEB_SEED = 42  # MTEB's default evaluator seed: the same embeddings give MTEB's V-measure exactly


def kmeans_v_measure(X: Matrix, labels: list, seed: int = MTEB_SEED, batch_size: int = 500) -> float:
    """100 x V-measure of MiniBatchKMeans(n_clusters = number of true labels) on X (MTEB's protocol)."""
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import v_measure_score

    n_clusters = len(set(labels))
    if n_clusters < 2:
        raise ValueError("clustering needs at least two distinct labels")
    if X.shape[0] != len(labels):
        raise ValueError(f"{X.shape[0]} embeddings but {len(labels)} labels")
    km = MiniBatchKMeans(n_clusters=n_clusters, batch_size=batch_size, n_init="auto", random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate points (identical binary rows) make k-means warn
        assigned = km.fit_predict(as_float(X))
    return 100.0 * float(v_measure_score(labels, assigned))
