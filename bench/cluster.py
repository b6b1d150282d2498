"""faiss k-means (ours) vs scikit-learn KMeans (the reference implementation's choice), same data, same k.

    python bench/cluster.py [--n 200000] [--d 384] [--k 150] [--niter 20]

Data: unit vectors drawn around k/2 random directions (clustered, like sentence embeddings). The default
n/k (~1333 points per centroid) is the paper's (6.8M texts / k=5000 = 1360).

Ours is what the cluster stage does: faiss spherical k-means trained on at most k * max_points_per_centroid
sampled points (the config default, 256, faiss' own default), then every point assigned to its nearest
centroid. The reference is sklearn KMeans fitted on all points (k-means++ init, n_init=1, and the same
number of iterations, which favours sklearn: its default max_iter is 300). Both inertias (sum of squared L2
distances to the nearest centroid over all n points, computed the same way) are printed so that speed is
compared at comparable quality, and so is faiss trained on every point (no sampling), for transparency.
Last line: `cluster_faiss_speedup: X` (sklearn time / our time).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cqg_ray.cluster import assign, train_kmeans
from cqg_ray.config import ClusterConfig


def inertias(x, c):
    """(inertia, partition inertia) of centroids c, from one nearest-centroid search. Inertia: squared L2 distance
    to the nearest centroid, summed. Partition inertia: the same measured to each part's mean, since spherical
    k-means keeps unit-norm centroids, which adds (1 - |mean|)^2 per point without changing the partition."""
    labels, score = assign(x, c, spherical=False)  # score = -squared L2 distance
    k = c.shape[0]
    sums = np.zeros((k, x.shape[1]), np.float64)
    np.add.at(sums, labels, x)
    counts = np.bincount(labels, minlength=k)
    means = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
    return float(-score.sum()), float(((x - means[labels]) ** 2).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--k", type=int, default=150)
    ap.add_argument("--niter", type=int, default=20)
    ap.add_argument("--max-points-per-centroid", type=int, default=ClusterConfig().max_points_per_centroid,
                    help="training sample cap per centroid, as in the cluster stage (default: the config's)")
    ap.add_argument("--sklearn-init", default="k-means++", help="k-means++ (sklearn's default, as the reference) or random")
    a = ap.parse_args()

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(a.k // 2, a.d)).astype(np.float32)
    x = centers[rng.integers(0, len(centers), a.n)] + rng.normal(scale=0.6, size=(a.n, a.d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)

    t0 = time.perf_counter()
    c_faiss, _ = train_kmeans(x, a.k, niter=a.niter, spherical=True, seed=0, max_points_per_centroid=a.max_points_per_centroid)
    t_train = time.perf_counter() - t0
    assign(x, c_faiss, spherical=True)
    t_faiss = time.perf_counter() - t0

    t0 = time.perf_counter()
    c_all, _ = train_kmeans(x, a.k, niter=a.niter, spherical=True, seed=0, max_points_per_centroid=a.n)
    assign(x, c_all, spherical=True)
    t_all = time.perf_counter() - t0

    from sklearn.cluster import KMeans

    t0 = time.perf_counter()
    km = KMeans(n_clusters=a.k, max_iter=a.niter, n_init=1, init=a.sklearn_init, random_state=0).fit(x)
    t_sk = time.perf_counter() - t0

    (i_f, p_f), (i_a, _), (i_s, p_s) = (inertias(x, c) for c in (c_faiss, c_all, km.cluster_centers_.astype(np.float32)))
    sample = min(a.n, a.k * a.max_points_per_centroid)
    print(f"data: n={a.n} d={a.d} k={a.k} niter={a.niter} ({a.n / a.k:.0f} points per centroid)")
    print(f"faiss, as the cluster stage ({sample} sampled, all assigned): {t_faiss:8.2f} s (train {t_train:.2f} s)  inertia {i_f:12.1f}")
    print(f"faiss trained on all {a.n} points, all assigned:   {t_all:8.2f} s   inertia {i_a:12.1f}")
    print(f"sklearn KMeans ({a.sklearn_init}) on all points:    {t_sk:8.2f} s   inertia {i_s:12.1f}")
    print(f"inertia ratio faiss/sklearn: {i_f / i_s:.4f} (sampled)  {i_a / i_s:.4f} (all points)")
    print(f"partition inertia (to each cluster's mean) ratio faiss/sklearn: {p_f / p_s:.4f}")
    print(f"speedup without sampling: {t_sk / t_all:.2f}")
    print(f"cluster_faiss_speedup: {t_sk / t_faiss:.2f}")


if __name__ == "__main__":
    main()
