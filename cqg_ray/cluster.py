"""Clustering (`cqg-ray cluster`): faiss k-means on the embeddings, every document assigned, centroid neighbours.

Pure core (numpy in, numpy out): ``train_kmeans``, ``assign``, ``centroid_neighbors``, ``drop_empty``.
Ray layer: train on a seeded sample of at most k * max_points_per_centroid documents (faiss' own cap),
assign every document in a Ray Data pass over the embedding files, drop clusters left empty
(renumbering the rest), and save:

    <run>/cluster/centroids.safetensors     (k, d) float32
    <run>/cluster/assignments.parquet       doc_id, cluster (int32), score (cosine to its centroid), sorted by doc_id
    <run>/cluster/neighbors.parquet         cluster, size, neighbors (nearest other centroids, nearest first), similarities

Later stages read them with ``cqg_ray.artifacts.Clusters``.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import embedding_files, embedding_matrix, load_doc_ids, load_embeddings
from cqg_ray.config import ClusterConfig
from cqg_ray.rundir import StageContext, documents_digest
from cqg_ray.search import top_k

log = logging.getLogger("cqg_ray")


# ----------------------------------------------------------------------------------------- pure core


def train_kmeans(x: np.ndarray, k: int, niter: int = 20, spherical: bool = True, seed: int = 0,
                 max_points_per_centroid: int = 256, verbose: bool = False) -> tuple[np.ndarray, float]:
    """faiss k-means. Returns (centroids (k, d) float32, objective of the last iteration)."""
    import faiss

    x = np.ascontiguousarray(x, dtype=np.float32)
    if len(x) < k:
        raise ValueError(f"k={k} clusters need at least {k} points, got {len(x)}")
    km = faiss.Kmeans(x.shape[1], k, niter=niter, spherical=spherical, seed=seed, verbose=verbose,
                      max_points_per_centroid=max_points_per_centroid, min_points_per_centroid=1)
    km.train(x)
    obj = float(km.obj[-1]) if len(km.obj) else float("nan")
    return np.ascontiguousarray(km.centroids, dtype=np.float32), obj


def assign(x: np.ndarray, centroids: np.ndarray, spherical: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid for each row: (cluster ids int32, score float32: inner product if spherical else -L2^2)."""
    import faiss

    x = np.ascontiguousarray(x, dtype=np.float32)
    index = faiss.IndexFlatIP(centroids.shape[1]) if spherical else faiss.IndexFlatL2(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    d, i = index.search(x, 1)
    score = d[:, 0] if spherical else -d[:, 0]
    return i[:, 0].astype(np.int32), score.astype(np.float32)


def centroid_neighbors(centroids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For each centroid its n nearest *other* centroids (by cosine), nearest first: (ids (k, n), sims (k, n))."""
    c = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    k = len(c)
    n = min(n, k - 1)
    if n <= 0:
        return np.zeros((k, 0), np.int32), np.zeros((k, 0), np.float32)
    sims = c @ c.T
    np.fill_diagonal(sims, -np.inf)
    best, idx = top_k(sims, n)  # ties: the lower cluster id first
    return idx.astype(np.int32), best.astype(np.float32)


def drop_empty(labels: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Remove centroids that got no document and renumber labels densely. Returns (labels, centroids, removed)."""
    sizes = np.bincount(labels, minlength=len(centroids))
    keep = np.flatnonzero(sizes > 0)
    if len(keep) == len(centroids):
        return labels, centroids, 0
    remap = np.full(len(centroids), -1, np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    return remap[labels], centroids[keep], int(len(centroids) - len(keep))


# ----------------------------------------------------------------------------------------- Ray layer


def _assign_batch(batch: pa.Table, centroids_ref, spherical: bool) -> pa.Table:
    import ray

    centroids = ray.get(centroids_ref) if isinstance(centroids_ref, ray.ObjectRef) else centroids_ref
    labels, score = assign(embedding_matrix(batch.column("embedding")), centroids, spherical)
    return pa.table({"doc_id": batch.column("doc_id"), "cluster": labels, "score": score})


def cluster(cfg: ClusterConfig, ctx: StageContext) -> None:
    import ray

    run = ctx.run
    ids = load_doc_ids(run)
    n = len(ids)
    if cfg.k > n:
        raise ValueError(f"cluster.k={cfg.k} is larger than the corpus ({n} documents): lower cluster.k")
    cap = cfg.k * cfg.max_points_per_centroid
    rng = np.random.default_rng(cfg.seed)
    sample_ids = ids if n <= cap else np.sort(rng.choice(ids, size=cap, replace=False))
    _, x = load_embeddings(run, sample_ids)
    t0 = time.time()
    log.info("cluster: faiss k-means k=%d on %d of %d documents (d=%d, %d iterations)", cfg.k, len(x), n, x.shape[1], cfg.niter)
    centroids, obj = train_kmeans(x, cfg.k, cfg.niter, cfg.spherical, cfg.seed, cfg.max_points_per_centroid)
    train_s = time.time() - t0
    del x

    t0 = time.time()
    ref = ray.put(centroids)
    files = embedding_files(run)
    ds = ray.data.read_parquet(files, filesystem=None if run.local else run.fs)
    ds = ds.map_batches(_assign_batch, fn_kwargs={"centroids_ref": ref, "spherical": cfg.spherical}, batch_format="pyarrow", batch_size=20_000)
    table = pa.concat_tables(list(ds.iter_batches(batch_format="pyarrow", batch_size=None))).sort_by("doc_id")
    assign_s = time.time() - t0
    digest = documents_digest(table.column("doc_id").to_pylist())
    run.check_documents(ctx.stage, digest, "encode")
    ctx.extra["documents_digest"] = digest
    labels = table.column("cluster").to_numpy()
    labels, centroids, removed = drop_empty(labels, centroids)
    if removed:
        log.warning("cluster: %d empty cluster(s) removed; %d clusters remain", removed, len(centroids))
    table = table.set_column(1, "cluster", pa.array(labels, pa.int32()))
    sizes = np.bincount(labels, minlength=len(centroids))
    nb, sims = centroid_neighbors(centroids, cfg.n_neighbors)

    from safetensors.numpy import save

    run.write_bytes(f"{ctx.stage}/centroids.safetensors", save({"centroids": centroids}))
    run.write_table(f"{ctx.stage}/assignments.parquet", table)
    run.write_table(f"{ctx.stage}/neighbors.parquet", pa.table({
        "cluster": pa.array(np.arange(len(centroids)), pa.int32()),
        "size": pa.array(sizes, pa.int64()),
        "neighbors": pa.array(nb.tolist(), pa.list_(pa.int32())),
        "similarities": pa.array(sims.tolist(), pa.list_(pa.float32())),
    }))
    ctx.counts.update({"documents": n, "trained_on": int(len(sample_ids)), "clusters": int(len(centroids)), "empty_removed": removed,
                       "size_min": int(sizes.min()), "size_median": float(np.median(sizes)), "size_max": int(sizes.max()),
                       "objective": round(obj, 4), "train_s": round(train_s, 2), "assign_s": round(assign_s, 2)})
