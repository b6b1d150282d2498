"""The prepare stage streams (issue 31): the sample's cut from a histogram of seeded keys, ids checked from per-shard
summaries; its result equals a plain in-memory computation (parse every file, dedup, keep the `limit` smallest keys)."""

import json

import numpy as np
import pyarrow as pa
import pytest

from cqg_ray.artifacts import load_corpus
from cqg_ray.config import CorpusConfig
from cqg_ray.corpus import CorpusError, dedup_table, parse_file, prepare, read_bytes, rows_table, sample_key
from cqg_ray.corpus.clean import SAMPLE_BINS, cut_bin, key_bins, prepared_shards, sample_cut, sample_keys, shard_bounds
from cqg_ray.corpus.read import list_files
from cqg_ray.corpus.stage import repeated_id
from cqg_ray.rundir import RunDir, documents_digest, run_stage


@pytest.mark.parametrize("n, bins", [(1000, SAMPLE_BINS), (5000, 16), (300, 4)])
def test_sample_cut_is_the_partition_of_all_keys(n, bins):
    rng = np.random.default_rng(n)
    keys = rng.random(n)
    keys[::50] = keys[1]  # ties
    keys[:3] = [0.0, 0.5, 1 - 2**-53]  # bin edges
    hist = np.bincount(key_bins(keys, bins), minlength=bins)
    assert hist.sum() == n and len(hist) == bins
    for limit in (1, 2, 7, n // 3, n // 2, n - 1, n):
        b, below = cut_bin(hist, limit)
        assert sample_cut(keys[key_bins(keys, bins) == b], limit, below) == np.partition(keys, limit - 1)[limit - 1]
    with pytest.raises(ValueError):
        cut_bin(hist, n + 1)


def test_shard_bounds_are_ray_datas_equal_ordered_splits():
    # what Ray Data 2.60's repartition(k, shuffle=False) gave for these n and k after a sort
    sizes = {(n, k): [b - a for a, b in zip(shard_bounds(n, k), shard_bounds(n, k)[1:])] for n, k in [(250, 3), (101, 2), (7, 3), (10, 4), (3000, 1)]}
    assert sizes == {(250, 3): [83, 83, 84], (101, 2): [50, 51], (7, 3): [2, 2, 3], (10, 4): [2, 3, 2, 3], (3000, 1): [3000]}


def test_prepared_shards_dedup_sample_sort_and_cut(tmp_path, corpus_file):
    c = CorpusConfig(paths=[str(_corpus(tmp_path, corpus_file))], limit=137, rows_per_shard=60, sample_seed=3)
    parsed = pa.concat_tables([rows_table(parse_file(read_bytes(u), f, u, c), u, c.dedup) for u, f in list_files(c.paths, c.format)])
    shards, n_docs = prepared_shards(parsed, c.dedup, c.limit, c.sample_seed, c.rows_per_shard)
    assert (parsed.num_rows, n_docs, [t.num_rows for t in shards]) == (435, 400, [45, 46, 46])
    assert pa.concat_tables(shards).equals(reference(c))
    shards, n_docs = prepared_shards(parsed, False, None, 0, 1000)
    assert (n_docs, [t.num_rows for t in shards]) == (435, [435])
    assert prepared_shards(parsed.slice(0, 0), True, 5, 0, 10) == ([], 0)


def test_sample_keys_are_sample_key():
    assert sample_keys(["a", "b"], 3).tolist() == [sample_key("a", 3), sample_key("b", 3)]


def _s(first, last, rows=2, sorted_=True, repeated=""):
    return {"first": first, "last": last, "rows": rows, "sorted": sorted_, "repeated": repeated}


def test_repeated_id_from_shard_summaries():
    assert repeated_id([_s("c", "d"), _s("a", "b")]) == ""
    assert repeated_id([_s("c", "d"), _s("a", "c")]) == "c"  # neighbouring shards share an edge id
    assert repeated_id([_s("a", "b", repeated="a"), _s("c", "d")]) == "a"
    assert repeated_id([_s("a", "c"), _s("b", "d")]) is None  # overlapping ranges: only reading every id tells
    assert repeated_id([_s("a", "b", sorted_=False), _s("c", "d")]) is None
    assert repeated_id([_s("", "", rows=0), _s("a", "b")]) == ""


@pytest.mark.ray
@pytest.mark.parametrize("one_task", [True, False])
def test_repeated_id_rows_reads_every_file(ray_local, tmp_path, monkeypatch, one_task):
    """Where the shards' summaries cannot tell (unsorted files): every id is read, by one task (files up to
    ONE_TASK_BYTES in all) or a Ray Data groupby, then two of its rows."""
    from cqg_ray.corpus.stage import repeated_id_rows

    if not one_task:
        monkeypatch.setattr("cqg_ray.corpus.stage.ONE_TASK_BYTES", 0)
    run = RunDir(str(tmp_path))

    def table(ids, source):
        return pa.table({"doc_id": ids, "source": [source] * len(ids), "line": list(range(1, len(ids) + 1))})

    run.write_table("a.parquet", table(["c", "a", "e"], "a.jsonl"))
    run.write_table("b.parquet", table(["b", "d"], "b.jsonl"))
    assert repeated_id_rows(run.fs, [run.path("a.parquet"), run.path("b.parquet")]) == []
    run.write_table("c.parquet", table(["f", "d"], "c.jsonl"))
    assert repeated_id_rows(run.fs, [run.path(n) for n in ("a.parquet", "b.parquet", "c.parquet")]) == [
        {"doc_id": "d", "source": "b.jsonl", "line": 2}, {"doc_id": "d", "source": "c.jsonl", "line": 2}]


def test_first_repeated_rows_finds_the_first_repeated_id_in_file_order(tmp_path):
    from cqg_ray.corpus.stage import first_repeated_rows

    run = RunDir(str(tmp_path))
    run.write_table("a.parquet", pa.table({"doc_id": ["q", "z", "y", "z", "z"], "source": ["a.jsonl"] * 5, "line": [1, 2, 3, 4, 5]}))
    run.write_table("b.parquet", pa.table({"doc_id": ["y", "q"], "source": ["b.jsonl"] * 2, "line": [1, 2]}))
    paths = [run.path("a.parquet"), run.path("b.parquet")]
    assert first_repeated_rows(run.fs, paths) == [{"doc_id": "q", "source": "a.jsonl", "line": 1}, {"doc_id": "q", "source": "b.jsonl", "line": 2}]
    assert first_repeated_rows(run.fs, paths[:1]) == [{"doc_id": "z", "source": "a.jsonl", "line": 2}, {"doc_id": "z", "source": "a.jsonl", "line": 4}]
    assert first_repeated_rows(run.fs, paths[1:]) == [] and first_repeated_rows(run.fs, []) == []


def test_read_parts_gives_each_file_in_blocks_with_the_dedup_bucket(tmp_path):
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from cqg_ray.corpus.stage import read_parts

    for name, n in (("a", 5), ("b", 0), ("c", 2)):
        pq.write_table(pa.table({"doc_id": [f"{name}{i}" for i in range(n)], "text_hash": [f"{i:02x}ff" for i in range(n)]},
                                schema=pa.schema([("doc_id", pa.string()), ("text_hash", pa.string())])), tmp_path / f"{name}.parquet")
    paths = [str(tmp_path / f"{x}.parquet") for x in "abc"]
    blocks = list(read_parts(paths, pafs.LocalFileSystem(), 2, True))
    assert [b.num_rows for b in blocks] == [2, 2, 1, 2]  # no block spans two files; an empty file gives none
    assert [r["doc_id"] for b in blocks for r in b.to_pylist()] == ["a0", "a1", "a2", "a3", "a4", "c0", "c1"]
    assert blocks[1].column("bucket").to_pylist() == ["02", "03"]
    assert [b.column_names for b in read_parts(paths[:1], pafs.LocalFileSystem(), 9, False)] == [["doc_id", "text_hash"]]


# ------------------------------------------------------------------------------------------- Ray


def reference(c: CorpusConfig) -> pa.Table:
    """What prepare should write, computed in memory: every file parsed, exact dedup over the whole corpus, the
    `limit` documents with the smallest sample keys, sorted by doc_id."""
    tables = [rows_table(parse_file(read_bytes(u), f, u, c), u, c.dedup) for u, f in list_files(c.paths, c.format)]
    t = pa.concat_tables(tables)
    if c.dedup:
        t, _ = dedup_table(t)
    t = t.drop_columns(["text_hash"])
    if c.limit is not None and t.num_rows > c.limit:
        keys = np.array([sample_key(d, c.sample_seed) for d in t.column("doc_id").to_pylist()])
        t = t.filter(pa.array(keys <= np.partition(keys, c.limit - 1)[c.limit - 1]))
    return t.sort_by("doc_id")


def _corpus(tmp_path, corpus_file):
    """The 400-text fixture in three files, with texts repeated inside a file and across files."""
    lines = corpus_file.read_text().splitlines()
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("\n".join(lines[:150] + lines[10:20]) + "\n")
    (src / "b.jsonl").write_text("\n".join(lines[150:300] + lines[:5]) + "\n")
    (src / "c.txt").write_text("\n".join(json.loads(x)["text"] for x in lines[300:] + lines[140:160]) + "\n")
    return src


@pytest.mark.ray
@pytest.mark.parametrize("path", ["one task", "ray data"])
@pytest.mark.parametrize("limit", [None, 137])
def test_prepare_equals_the_in_memory_reference(ray_local, tmp_path, corpus_file, limit, path, monkeypatch):
    """Both ways the stage writes its shards (one task for small parts, Ray Data passes past ONE_TASK_BYTES) write the
    reference's rows in the same shards."""
    import cqg_ray.corpus.stage as stage

    if path == "ray data":
        monkeypatch.setattr(stage, "ONE_TASK_BYTES", -1)
    c = CorpusConfig(paths=[str(_corpus(tmp_path, corpus_file))], limit=limit, rows_per_shard=60, sample_seed=3)
    run = RunDir(str(tmp_path / "run"))
    import ray.data

    before = ray.data.DataContext.get_current().shuffle_input_batch_bytes
    m = run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    assert ray.data.DataContext.get_current().shuffle_input_batch_bytes == before  # the stage's smaller batches end with it
    want = reference(c)
    got = load_corpus(run)
    assert got.equals(want.select(got.column_names))
    assert m["counts"]["documents"] == want.num_rows == (limit or 400)
    assert m["counts"]["read_rows"] == 435 and m["counts"]["duplicates"] == 35
    assert m["counts"]["sampled_out"] == 400 - want.num_rows
    assert m["documents_digest"] == documents_digest(want.column("doc_id").to_pylist())
    assert sum(run.parquet_rows("prepare").values()) == want.num_rows
    shards = run.ls("prepare", suffix=".parquet")  # equal, ordered splits of at most 60 rows, in name order
    assert [run.read_table(f"prepare/{n}").num_rows for n in shards] == ([57] * 6 + [58] if limit is None else [45, 46, 46])
    assert not run.exists("prepare/_parts")


@pytest.mark.ray
def test_prepare_repeated_id_is_an_error(ray_local, tmp_path):
    rows = [{"id": f"x{i % 7}" if i in (3, 40) else f"x{i}", "text": f"text number {i}"} for i in range(60)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = RunDir(str(tmp_path / "run"))
    c = CorpusConfig(paths=[str(tmp_path / "a.jsonl")], id_column="id", rows_per_shard=10)
    with pytest.raises(CorpusError) as e:
        run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    a = tmp_path / "a.jsonl"
    assert str(e.value) == f"document id 'x5' appears more than once ({a}:6 and {a}:41; check corpus.id_column)"
    assert run.state("prepare").state == "missing"
