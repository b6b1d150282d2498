"""Clustering (`cqg-ray cluster`): faiss k-means on the embeddings, every document assigned, centroid neighbours.

Pure core (numpy in, numpy out): ``train_kmeans``, ``assign``, ``centroid_neighbors``, ``drop_empty`` (and
``empty_remap``, its renumbering from cluster sizes).
Ray layer, streamed: one Ray task draws the seeded sample of at most k * max_points_per_centroid documents (faiss'
own cap), reads their embeddings and trains; a Ray Data ``map_batches`` over the embedding files assigns every
document (one task a file, which it reads itself, so the embeddings never enter the object store), each worker
writing its batches as Parquet parts and returning counters (rows, cluster sizes, a documents
digest); clusters left empty are dropped (the rest renumbered) by one task that streams the parts into the final
file. The driver holds the centroids and those counters, never the sample, the doc ids or the assignments. It saves:

    <run>/cluster/centroids.safetensors     (k, d) float32
    <run>/cluster/assignments.parquet       doc_id, cluster (int32), score (cosine to its centroid), sorted by doc_id
    <run>/cluster/neighbors.parquet         cluster, size, neighbors (nearest other centroids, nearest first), similarities

Later stages read them with ``cqg_ray.artifacts.Clusters``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.artifacts import add_digests, embedding_batches, embedding_files, embedding_matrix, load_doc_ids, load_embeddings
from cqg_ray.config import ClusterConfig, ConfigError
from cqg_ray.rundir import RunDir, StageContext, documents_digest
from cqg_ray.ranking import top_k

log = logging.getLogger("cqg_ray")

ASSIGNMENTS_SCHEMA = pa.schema([("doc_id", pa.string()), ("cluster", pa.int32()), ("score", pa.float32())])
ROW_GROUP_ROWS = 1 << 20  # rows of one row group of assignments.parquet (pyarrow's default for one write_table)


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


def empty_remap(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The renumbering that drops empty clusters, from the clusters' sizes: (remap (k,) int32, -1 for an empty
    cluster, else its new dense id in the old order; the kept old ids)."""
    keep = np.flatnonzero(np.asarray(sizes) > 0)
    remap = np.full(len(sizes), -1, np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    return remap, keep


def drop_empty(labels: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Remove centroids that got no document and renumber labels densely. Returns (labels, centroids, removed)."""
    remap, keep = empty_remap(np.bincount(labels, minlength=len(centroids)))
    if len(keep) == len(centroids):
        return labels, centroids, 0
    return remap[labels], centroids[keep], int(len(centroids) - len(keep))


# ----------------------------------------------------------------------------------------- Ray layer

COUNTERS_SCHEMA = pa.schema([("part", pa.string()), ("rows", pa.int64()), ("first", pa.string()), ("last", pa.string()),
                             ("digest", pa.string()), ("sizes", pa.list_(pa.int64()))])


def _train(root: str, cfg: ClusterConfig) -> dict:
    """Ray task: draw the seeded training sample (the sorted ids, ``rng.choice`` without replacement, as the driver
    drew it before), read its embeddings and train. Returns centroids, objective and the sample's size."""
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)  # Ray gives a 1-CPU task OMP_NUM_THREADS=1; the stage runs alone
    run = RunDir(root)
    ids = load_doc_ids(run)
    n, cap = len(ids), cfg.k * cfg.max_points_per_centroid
    sample_ids = ids if n <= cap else np.sort(np.random.default_rng(cfg.seed).choice(ids, size=cap, replace=False))
    del ids
    _, x = load_embeddings(run, sample_ids)
    t0 = time.time()
    centroids, obj = train_kmeans(x, cfg.k, cfg.niter, cfg.spherical, cfg.seed, cfg.max_points_per_centroid)
    return {"centroids": centroids, "objective": obj, "trained_on": int(len(x)), "train_s": time.time() - t0}


def _assign_batch(batch: pa.Table, centroids_ref, spherical: bool, parts_uri: str) -> pa.Table:
    """Ray Data map: assign a batch, write it (sorted by doc_id, clusters not yet renumbered) as a part file, and
    return its counters: part name, rows, first and last doc id, documents digest, cluster sizes."""
    import ray

    centroids = ray.get(centroids_ref) if isinstance(centroids_ref, ray.ObjectRef) else centroids_ref
    if batch.num_rows == 0:
        return COUNTERS_SCHEMA.empty_table()
    labels, score = assign(embedding_matrix(batch.column("embedding")), centroids, spherical)
    part = pa.table({"doc_id": batch.column("doc_id"), "cluster": labels, "score": score}).sort_by("doc_id").cast(ASSIGNMENTS_SCHEMA)
    name = f"part-{uuid.uuid4().hex}.parquet"  # a retried task writes another part; only the parts reported are read
    RunDir(parts_uri).write_table(name, part)
    ids = part.column("doc_id")
    return pa.table({"part": [name], "rows": [part.num_rows], "first": [ids[0].as_py()], "last": [ids[-1].as_py()],
                     "digest": [documents_digest(ids.to_pylist())],
                     "sizes": [np.bincount(labels, minlength=len(centroids)).tolist()]}, schema=COUNTERS_SCHEMA)


def _assign_files(batch: pa.Table, root: str, centroids_ref, spherical: bool, parts_uri: str, rows: int) -> pa.Table:
    """Ray Data map over embedding files (a ``path`` column, inside the run's filesystem): each file read here in
    batches of ``rows`` rows, each batch assigned and written as a part (`_assign_batch`); their counters."""
    out = [_assign_batch(t, centroids_ref, spherical, parts_uri) for t in embedding_batches(batch.column("path").to_pylist(), RunDir(root).fs, rows)]
    return pa.concat_tables(out) if out else COUNTERS_SCHEMA.empty_table()


def _ordered_disjoint(firsts: list[str], lasts: list[str]) -> bool:
    """Whether parts in this order hold ascending, disjoint ranges of doc ids."""
    return all(lasts[i] < firsts[i + 1] for i in range(len(firsts) - 1))


def write_assignments(root: str, rel: str, parts_rel: str, parts: list[dict], remap: np.ndarray | None) -> dict:
    """Ray task: one ``assignments.parquet`` sorted by doc_id from sorted part files, clusters renumbered by ``remap``.

    Parts that hold disjoint ranges of doc ids (the embedding files do, so a batch does) stream one at a time, in
    row groups of ``ROW_GROUP_ROWS`` (a corpus under that size gives the one row group that ``write_table`` gave);
    otherwise every part is read and sorted here."""
    run = RunDir(root)
    parts = sorted(parts, key=lambda p: (p["first"], p["last"]))
    streamed = _ordered_disjoint([p["first"] for p in parts], [p["last"] for p in parts])

    def renumber(t: pa.Table) -> pa.Table:
        if remap is None:
            return t
        return t.set_column(1, "cluster", pa.array(remap[t.column("cluster").to_numpy()], pa.int32()))

    def read(p: dict) -> pa.Table:
        return pq.read_table(run.path(parts_rel, p["part"]), filesystem=run.fs)

    def tables():
        if not streamed:
            yield renumber(pa.concat_tables([read(p) for p in parts]).sort_by("doc_id")).combine_chunks()
            return
        pending, rows = [], 0
        for p in parts:
            pending.append(renumber(read(p)))
            rows += pending[-1].num_rows
            while rows >= ROW_GROUP_ROWS:
                t = pa.concat_tables(pending).combine_chunks()
                yield t.slice(0, ROW_GROUP_ROWS)
                pending, rows = [t.slice(ROW_GROUP_ROWS)], t.num_rows - ROW_GROUP_ROWS
        if rows:
            yield pa.concat_tables(pending).combine_chunks()

    rows = run.write_tables(rel, ASSIGNMENTS_SCHEMA, tables())
    return {"rows": rows, "streamed": streamed}


def assign_all(run: RunDir, stage: str, centroids: np.ndarray, spherical: bool = True, batch_size: int = 20_000) -> dict:
    """Assign every embedded document in a Ray Data pass and write ``<stage>/assignments.parquet``, empty clusters
    dropped. The driver gets one row of counters per batch. Returns the kept centroids, the sizes (per kept cluster),
    the clusters removed, the documents digest, the rows and whether the final write streamed."""
    import ray

    parts_rel = f"{stage}/_parts"
    run.rm(parts_rel)  # what a killed run left
    run.makedirs(parts_rel)
    ref = ray.put(centroids)
    files = embedding_files(run)
    # one task a file, which it reads itself: the embeddings never enter the object store, and a part never joins
    # rows of two files (the files hold ascending id ranges, so the parts do too and the final write streams)
    ds = ray.data.from_items([{"path": p} for p in files], override_num_blocks=max(1, len(files)))
    ds = ds.map_batches(_assign_files, fn_kwargs={"root": run.root_uri, "centroids_ref": ref, "spherical": spherical,
                                                  "parts_uri": run.uri(parts_rel), "rows": batch_size},
                        batch_format="pyarrow", batch_size=1)
    sizes = np.zeros(len(centroids), np.int64)
    parts, digests = [], []
    for b in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        for row in b.to_pylist():
            sizes += np.asarray(row["sizes"], np.int64)
            digests.append(row["digest"])
            parts.append({k: row[k] for k in ("part", "first", "last")})
    remap, keep = empty_remap(sizes)
    removed = int(len(centroids) - len(keep))
    out = ray.get(ray.remote(write_assignments).options(num_cpus=1).remote(
        run.root_uri, f"{stage}/assignments.parquet", parts_rel, parts, remap if removed else None))
    run.rm(parts_rel)
    log.info("cluster: %d documents assigned in %d parts, %s", out["rows"], len(parts),
             "streamed into one file" if out["streamed"] else "sorted into one file in a task (the parts' id ranges overlap)")
    return {"centroids": centroids[keep] if removed else centroids, "sizes": sizes[keep], "removed": removed,
            "digest": add_digests(digests), "rows": out["rows"], "streamed": out["streamed"]}


def cluster(cfg: ClusterConfig, ctx: StageContext) -> None:
    import ray

    run = ctx.run
    files = embedding_files(run)
    n = sum(pq.ParquetFile(f, filesystem=run.fs).metadata.num_rows for f in files)
    if cfg.k > n:
        raise ConfigError(f"cluster.k={cfg.k} is larger than the corpus ({n} documents): lower cluster.k")
    log.info("cluster: faiss k-means k=%d on at most %d of %d documents (%d iterations), in a Ray task",
             cfg.k, min(n, cfg.k * cfg.max_points_per_centroid), n, cfg.niter)
    trained = ray.get(ray.remote(_train).options(num_cpus=1).remote(run.root_uri, cfg))
    centroids = trained["centroids"]

    t0 = time.time()
    a = assign_all(run, ctx.stage, centroids, cfg.spherical)
    assign_s = time.time() - t0
    run.check_documents(ctx.stage, a["digest"], "encode")
    ctx.extra["documents_digest"] = a["digest"]
    if a["removed"]:
        log.warning("cluster: %d empty cluster(s) removed; %d clusters remain", a["removed"], len(a["centroids"]))
    centroids, sizes = a["centroids"], a["sizes"]
    nb, sims = centroid_neighbors(centroids, cfg.n_neighbors)

    from safetensors.numpy import save

    run.write_bytes(f"{ctx.stage}/centroids.safetensors", save({"centroids": centroids}))
    run.write_table(f"{ctx.stage}/neighbors.parquet", pa.table({
        "cluster": pa.array(np.arange(len(centroids)), pa.int32()),
        "size": pa.array(sizes, pa.int64()),
        "neighbors": pa.array(nb.tolist(), pa.list_(pa.int32())),
        "similarities": pa.array(sims.tolist(), pa.list_(pa.float32())),
    }))
    ctx.counts.update({"documents": n, "trained_on": trained["trained_on"], "clusters": int(len(centroids)), "empty_removed": a["removed"],
                       "size_min": int(sizes.min()), "size_median": float(np.median(sizes)), "size_max": int(sizes.max()),
                       "objective": round(trained["objective"], 4), "train_s": round(trained["train_s"], 2), "assign_s": round(assign_s, 2)})
