"""Search over budgeted (sparse) embeddings: the inverted index (`cqg_ray.search.SparseIndex`, a scipy CSC matrix
whose columns are the questions' postings) against faiss (`IndexFlatIP` on the same vectors densified and
normalised) and a full sparse matrix product (CSR), side by side on the same corpus and queries.

    python bench/sparse_search.py [--docs 200000] [--m 636] [--k-active 64] [--queries 200]

Corpus: --docs vectors of --m questions with --k-active active each (questions drawn with a skewed popularity, as
real yes-rates are; centred values in [-0.3, 0.6]), queries alike. Each method returns the exact top-10 by cosine;
the results are checked equal. Printed: seconds per query (median of the queries, one at a time, as `cqg-ray search`
does), the index's memory, and the peak RSS of this process. Last line: `sparse_inverted_vs_faiss_flat: X` (faiss's
seconds per query over the inverted index's; above 1 = the inverted index is faster).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _common import cpu_line


def corpus(n: int, m: int, k: int, seed: int):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    pop = rng.zipf(1.3, size=m).astype(np.float64)
    pop /= pop.sum()
    rows = np.repeat(np.arange(n), k)
    cols = np.concatenate([rng.choice(m, size=k, replace=False, p=pop) for _ in range(n)])
    vals = rng.uniform(-0.3, 0.6, size=n * k).astype(np.float32)
    return sp.csr_array((vals, (rows, cols)), shape=(n, m))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--m", type=int, default=636)
    ap.add_argument("--k-active", type=int, default=64)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    print(cpu_line(), flush=True)
    import faiss

    from cqg_ray.ranking import top_k
    from cqg_ray.search import SparseIndex

    X = corpus(a.docs, a.m, a.k_active, 0)
    Q = corpus(a.queries, a.m, a.k_active, 1).toarray()
    ids = np.array([str(i) for i in range(a.docs)], dtype=object)
    t0 = time.perf_counter()
    index = SparseIndex(ids, X, a.m)
    build_inv = time.perf_counter() - t0
    inv_mb = (index.postings.data.nbytes + index.postings.indices.nbytes + index.postings.indptr.nbytes) / 2**20
    rss_inv = rss_mb()

    t0 = time.perf_counter()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
    dense = (X.toarray() / np.where(norms > 0, norms, 1)[:, None]).astype(np.float32)
    flat = faiss.IndexFlatIP(a.m)
    flat.add(dense)
    build_faiss = time.perf_counter() - t0
    faiss_mb = dense.nbytes / 2**20
    rows_csr = index.rows

    def by_inverted(q):
        return [int(h.doc_id) for h in index.search(q, a.top)]

    def by_faiss(q):
        qn = (q / np.linalg.norm(q)).astype(np.float32)[None]
        s, i = flat.search(qn, a.top + 20)  # a few spare, then the exact tie order of the others
        s, i = s[0], i[0]
        return [int(x) for x in i[np.lexsort((i, -np.round(s, 5)))][: a.top]]

    def by_csr(q):
        dots = rows_csr @ q
        scores = np.where(norms > 0, dots / (np.where(norms > 0, norms, 1) * np.linalg.norm(q)), 0)
        return top_k(scores, a.top)[1].tolist()

    methods = {"inverted index (SparseIndex, scipy CSC)": by_inverted, "faiss IndexFlatIP (dense, normalised)": by_faiss,
               "CSR matrix product (all rows)": by_csr}
    times = {name: [] for name in methods}
    agree = 0
    for q in Q:
        got = {}
        for name, fn in methods.items():
            t0 = time.perf_counter()
            got[name] = fn(q)
            times[name].append(time.perf_counter() - t0)
        first = list(got.values())
        agree += all(set(g[: a.top - 1]) <= set(first[0]) for g in first[1:])
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"\n{a.docs} documents, m={a.m}, {a.k_active} active questions each ({X.nnz} nonzeros); {a.queries} queries, top {a.top}")
    print(f"  {'method':<42}{'ms/query':>10}{'index MiB':>11}{'build s':>9}")
    print(f"  {'inverted index (SparseIndex, scipy CSC)':<42}{med['inverted index (SparseIndex, scipy CSC)'] * 1e3:>10.2f}{inv_mb:>11.1f}{build_inv:>9.2f}")
    print(f"  {'faiss IndexFlatIP (dense, normalised)':<42}{med['faiss IndexFlatIP (dense, normalised)'] * 1e3:>10.2f}{faiss_mb:>11.1f}{build_faiss:>9.2f}")
    print(f"  {'CSR matrix product (all rows)':<42}{med['CSR matrix product (all rows)'] * 1e3:>10.2f}{'(same)':>11}{'':>9}")
    print(f"  queries whose top {a.top} agree across the methods (up to float ties): {agree} / {a.queries}")
    print(f"  peak RSS {rss_mb():.0f} MiB (after the inverted index alone: {rss_inv:.0f} MiB)")
    print(f"sparse_inverted_vs_faiss_flat: {med['faiss IndexFlatIP (dense, normalised)'] / med['inverted index (SparseIndex, scipy CSC)']:.2f}")


if __name__ == "__main__":
    main()
