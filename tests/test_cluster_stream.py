"""The cluster stage streams (issue 31): k-means in a task, assignment in a Ray Data pass whose workers write parts,
one task that writes the final file; the driver holds centroids and counters. Checked against the in-driver result."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cqg_ray.cluster as cl
from cqg_ray.artifacts import Clusters, add_digests, embeddings_table, load_embeddings
from cqg_ray.cluster import assign, assign_all, cluster, drop_empty, empty_remap, write_assignments
from cqg_ray.config import ClusterConfig, ConfigError
from cqg_ray.rundir import RunDir, documents_digest, run_stage


def test_empty_remap_is_drop_empty():
    labels = np.array([0, 3, 3, 0, 5, 3])
    cent = np.arange(12, dtype=np.float32).reshape(6, 2)
    remap, keep = empty_remap(np.bincount(labels, minlength=6))
    want, c2, removed = drop_empty(labels, cent)
    assert remap[labels].tolist() == want.tolist()
    assert cent[keep].tolist() == c2.tolist() and removed == 6 - len(keep) == 3
    assert remap.tolist() == [0, -1, -1, 1, -1, 2]


def test_add_digests_is_the_digest_of_the_union():
    ids = [f"d{i}" for i in range(50)]
    assert add_digests([documents_digest(ids[:7]), documents_digest(ids[7:30]), documents_digest(ids[30:])]) == documents_digest(ids)
    assert add_digests([]) == documents_digest([])


def _parts(run, tables):
    parts = []
    for i, t in enumerate(tables):
        t = t.sort_by("doc_id")
        run.write_table(f"c/_parts/p{i}.parquet", t)
        parts.append({"part": f"p{i}.parquet", "first": t.column("doc_id")[0].as_py(), "last": t.column("doc_id")[-1].as_py()})
    return parts


@pytest.mark.parametrize("disjoint", [True, False])
def test_write_assignments_streams_disjoint_parts_and_sorts_the_rest(tmp_path, monkeypatch, disjoint):
    run = RunDir(str(tmp_path))
    ids = np.array([f"d{i:03d}" for i in range(23)], dtype=object)
    labels = np.arange(23, dtype=np.int32) % 4
    full = pa.table({"doc_id": pa.array(ids, pa.string()), "cluster": labels, "score": np.linspace(0, 1, 23, dtype=np.float32)})
    order = np.arange(23) if disjoint else np.random.default_rng(0).permutation(23)
    pieces = [full.take(order[a:b]) for a, b in ((0, 9), (9, 10), (10, 23))]
    parts = _parts(run, pieces[::-1])  # listed out of order: the task orders them
    monkeypatch.setattr(cl, "ROW_GROUP_ROWS", 5)
    remap = np.array([1, -1, 0, 2], np.int32)  # the renumbering is applied to every row
    out = write_assignments(run.root_uri, "c/assignments.parquet", "c/_parts", parts, remap)
    assert out == {"rows": 23, "streamed": disjoint}
    got = pq.read_table(run.path("c/assignments.parquet"))
    assert got.schema == cl.ASSIGNMENTS_SCHEMA
    assert got.column("doc_id").to_pylist() == ids.tolist()
    assert got.column("cluster").to_pylist() == remap[labels].tolist()
    assert got.column("score").to_pylist() == full.column("score").to_pylist()
    rg = pq.ParquetFile(run.path("c/assignments.parquet")).metadata
    assert [rg.row_group(i).num_rows for i in range(rg.num_row_groups)] == ([5, 5, 5, 5, 3] if disjoint else [23])


# ------------------------------------------------------------------------------------------- Ray


def _encoded_run(path, layout: str, n=500, d=16, files=4, seed=0) -> tuple[RunDir, np.ndarray, np.ndarray]:
    """A run directory with a finished encode stage of n unit vectors in the positive orthant (so that a centroid
    in the negative orthant gets no document): files of ascending id ranges ('sorted') or of random ids ('shuffled')."""
    rng = np.random.default_rng(seed)
    ids = np.array([f"doc{i:05d}" for i in rng.permutation(10 * n)[:n]], dtype=object)
    ids.sort()
    x = np.abs(rng.normal(size=(n, d))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    order = np.arange(n) if layout == "sorted" else rng.permutation(n)
    run = RunDir(str(path))

    def write(ctx):
        for i, chunk in enumerate(np.array_split(order, files)):
            run.write_table(f"encode/emb-{i:04d}.parquet", embeddings_table(ids[chunk], x[chunk]))
        ctx.counts["documents"] = n
        ctx.extra["documents_digest"] = documents_digest(ids)

    run_stage(run, "encode", "h", write, deps=[])
    return run, ids, x


def test_a_file_task_reads_its_file_in_batches_and_writes_one_part_a_batch(tmp_path):
    run, ids, x = _encoded_run(tmp_path / "run", "shuffled", n=50, files=2)
    centroids = x[:3]
    paths = run.ls("encode", suffix=".parquet")
    out = cl._assign_files(pa.table({"path": [run.path("encode", p) for p in paths]}), run.root_uri, centroids, True, run.uri("parts"), rows=10)
    assert out.num_rows == 6 and out.column("rows").to_pylist() == [10, 10, 5, 10, 10, 5]  # 25 rows a file, no part spans two
    for p, first, last in zip(*(out.column(k).to_pylist() for k in ("part", "first", "last"))):
        t = run.read_table(f"parts/{p}")
        assert t.column("doc_id").to_pylist() == sorted(t.column("doc_id").to_pylist()) and (first, last) == (t["doc_id"][0].as_py(), t["doc_id"][-1].as_py())
        want, _ = assign(load_embeddings(run, t.column("doc_id").to_pylist())[1], centroids)
        assert t.column("cluster").to_pylist() == want.tolist()
    assert sum(np.array(out.column("sizes").to_pylist()).sum(axis=0)) == 50
    assert cl._assign_files(pa.table({"path": pa.array([], pa.string())}), run.root_uri, centroids, True, run.uri("parts"), rows=10).num_rows == 0


@pytest.mark.ray
@pytest.mark.parametrize("layout", ["sorted", "shuffled"])
def test_streamed_assignment_equals_the_in_driver_result(ray_local, tmp_path, layout):
    run, ids, x = _encoded_run(tmp_path / "run", layout)
    rng = np.random.default_rng(1)
    live = np.abs(rng.normal(size=(6, x.shape[1]))).astype(np.float32)
    dead = -np.ones((2, x.shape[1]), np.float32)  # nearest to no document
    centroids = np.concatenate([live[:2], dead[:1], live[2:], dead[1:]])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)

    got = assign_all(run, "cluster", centroids, spherical=True, batch_size=37)

    labels, score = assign(x, centroids)  # today's in-driver result: the whole matrix, then drop_empty
    want_labels, want_centroids, removed = drop_empty(labels, centroids)
    assert got["removed"] == removed >= 2
    assert np.array_equal(got["centroids"], want_centroids)
    assert got["sizes"].tolist() == np.bincount(want_labels).tolist()
    assert got["digest"] == documents_digest(ids) and got["rows"] == len(ids)
    # batches in file order: parts of id-ordered files stream; parts of random ids overlap and the task sorts them all
    assert got["streamed"] == (layout == "sorted")
    a = run.read_table("cluster/assignments.parquet")
    assert a.column("doc_id").to_pylist() == ids.tolist()
    assert a.column("cluster").to_numpy().tolist() == want_labels.tolist()
    assert np.array_equal(a.column("score").to_numpy(), score)
    # byte for byte the file the driver wrote before (one table, sorted, clusters renumbered, pq.write_table)
    run.write_table("ref.parquet", pa.table({"doc_id": pa.array(ids, pa.string()), "cluster": pa.array(want_labels, pa.int32()),
                                             "score": score}))
    assert run.read_bytes("cluster/assignments.parquet") == run.read_bytes("ref.parquet")
    assert not run.exists("cluster/_parts")


@pytest.mark.ray
def test_cluster_stage_streams(ray_local, tmp_path):
    run, ids, x = _encoded_run(tmp_path / "run", "shuffled", n=400)
    cfg = ClusterConfig(k=5, n_neighbors=3, max_points_per_centroid=40)  # trains on a sample of 200 of the 400
    m = run_stage(run, "cluster", cfg.config_hash(), lambda ctx: cluster(cfg, ctx), deps=["encode"])
    assert m["counts"]["documents"] == 400 and m["counts"]["trained_on"] == 200
    assert m["documents_digest"] == documents_digest(ids)
    c = Clusters.load(run)
    from safetensors.numpy import load

    centroids = load(run.read_bytes("cluster/centroids.safetensors"))["centroids"]
    labels, score = assign(x, centroids)  # the saved centroids have no empty cluster: assigning again is the same
    assert c.doc_ids.tolist() == ids.tolist()
    assert c.labels.tolist() == labels.tolist()
    assert np.array_equal(run.read_table("cluster/assignments.parquet").column("score").to_numpy(), score)
    assert c.sizes.tolist() == np.bincount(labels, minlength=len(centroids)).tolist()
    assert c.neighbors.shape == (len(centroids), 3)
    # the sample the task drew is the one the driver drew before: seeded choice from the sorted ids
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(np.sort(ids), size=200, replace=False))
    _, xs = load_embeddings(run, sample)
    want, obj = cl.train_kmeans(xs, 5, cfg.niter, cfg.spherical, cfg.seed, cfg.max_points_per_centroid)
    assert np.allclose(want, centroids, atol=1e-5)

    with pytest.raises(ConfigError, match="cluster.k=500 is larger than the corpus"):  # a bad config: exit 2, no traceback
        big = ClusterConfig(k=500)
        run_stage(run, "cluster", big.config_hash(), lambda ctx: cluster(big, ctx), deps=["encode"])
