"""faiss k-means (ours) vs scikit-learn KMeans (the reference implementation's choice), same data, same k.

    python bench/cluster.py [--n 100000] [--d 384] [--k 500] [--niter 20]

Data: unit vectors drawn around k/2 random directions (clustered, like sentence embeddings). Both
inertias (sum of squared L2 distances to the nearest centroid, computed the same way for both) are
printed so that speed is compared at comparable quality. Last line: `cluster_faiss_speedup: X`.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cqg_ray.cluster import assign, train_kmeans  # noqa: E402


def inertia(x, c):
    import faiss

    index = faiss.IndexFlatL2(c.shape[1])
    index.add(np.ascontiguousarray(c, dtype=np.float32))
    d, _ = index.search(x, 1)
    return float(d.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument("--niter", type=int, default=20)
    ap.add_argument("--sklearn-init", default="k-means++", help="k-means++ (sklearn's default, as the reference) or random")
    a = ap.parse_args()

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(a.k // 2, a.d)).astype(np.float32)
    x = centers[rng.integers(0, len(centers), a.n)] + rng.normal(scale=0.6, size=(a.n, a.d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)

    t0 = time.perf_counter()
    c_faiss, _ = train_kmeans(x, a.k, niter=a.niter, spherical=True, seed=0, max_points_per_centroid=a.n)
    t_faiss = time.perf_counter() - t0

    from sklearn.cluster import KMeans

    t0 = time.perf_counter()
    km = KMeans(n_clusters=a.k, max_iter=a.niter, n_init=1, init=a.sklearn_init, random_state=0).fit(x)
    t_sk = time.perf_counter() - t0

    i_f, i_s = inertia(x, c_faiss), inertia(x, km.cluster_centers_.astype(np.float32))
    print(f"data: n={a.n} d={a.d} k={a.k} niter={a.niter}")
    print(f"faiss k-means (spherical): {t_faiss:8.2f} s   inertia {i_f:12.1f}")
    print(f"sklearn KMeans ({a.sklearn_init}): {t_sk:8.2f} s   inertia {i_s:12.1f}")
    print(f"inertia ratio faiss/sklearn: {i_f / i_s:.4f}")
    print(f"cluster_faiss_speedup: {t_sk / t_faiss:.2f}")


if __name__ == "__main__":
    main()
