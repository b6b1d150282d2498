"""Work units read only their own rows (issue 31, item 2): `units.read_unit` reads the row groups that hold a unit's
rows and the footer's exact bytes, measured against an independent count at the filesystem; and (ray) a whole
`cqg-ray embed` pass reads at most 1.1 x the bytes of its snapshot, with outputs that are the snapshot's rows."""

import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from cqg_ray.units import UnitActor, read_unit, row_groups_for, split_units


class CountingHandler(pafs.FileSystemHandler):
    """A local filesystem that counts every byte read from the files it opens (independent of `read_unit`'s count)."""

    def __init__(self):
        self.local, self.bytes_read = pafs.LocalFileSystem(), 0

    def open_input_file(self, path):
        handler = self

        class Counted:
            def __init__(self, f):
                self.f, self.closed = f, False

            def read(self, n=-1):
                data = self.f.read() if n is None or n < 0 else self.f.read(n)
                handler.bytes_read += len(data)
                return data

            def seek(self, pos, whence=0):
                return self.f.seek(pos, whence)

            def tell(self):
                return self.f.tell()

            def size(self):
                return self.f.size()

            def close(self):
                self.closed = True
                self.f.close()

            def readable(self):
                return True

            def seekable(self):
                return True

        return pa.PythonFile(Counted(self.local.open_input_file(path)), mode="r")

    # the rest of the interface, delegated
    def get_type_name(self):
        return "counting"

    def equals(self, other):
        return self is other

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def normalize_path(self, path):
        return path

    def open_input_stream(self, path):
        return self.open_input_file(path)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        raise NotImplementedError


def shard(path, rows=1000, row_group=100, seed=0):
    """A snapshot-like part: doc_id, text, source, line, in row groups of ``row_group`` rows."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta river town doctor music bread orchard glacier chess lamp keeper".split()
    t = pa.table({"doc_id": [f"doc-{seed}-{i:06d}" for i in range(rows)],
                  "text": [" ".join(rng.choice(words) for _ in range(rng.randint(10, 60))) for _ in range(rows)],
                  "source": ["a.jsonl"] * rows, "line": list(range(1, rows + 1))})
    pq.write_table(t, path, row_group_size=row_group)
    return t


def chunk_bytes(meta, groups, columns=("doc_id", "text")):
    """Compressed bytes of the given columns' chunks in these row groups (from the footer)."""
    names = [meta.schema.column(c).name for c in range(meta.num_columns)]
    return sum(meta.row_group(g).column(names.index(c)).total_compressed_size for g in groups for c in columns)


def footer_bytes(path):
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return int.from_bytes(f.read(4), "little") + 8


def test_row_groups_for():
    meta = pq.read_metadata(pa.BufferReader(_buf(pa.table({"x": list(range(25))}), 10)))
    assert row_groups_for(meta, 0, 10) == ([0], 0)
    assert row_groups_for(meta, 10, 20) == ([1], 10)
    assert row_groups_for(meta, 5, 21) == ([0, 1, 2], 0)
    assert row_groups_for(meta, 20, 25) == ([2], 20)
    assert row_groups_for(meta, 25, 25) == ([], 25)


def _buf(table, rg):
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rg)
    return sink.getvalue()


def test_units_read_each_row_group_once_and_the_same_rows_as_a_whole_read(tmp_path):
    """Units aligned with the row groups: every unit's table equals the old read (the whole shard, sliced); the bytes
    read, counted by the filesystem, equal `read_unit`'s own count, and are the doc_id and text chunks of each row
    group once plus the footer once: less than the file (source and line stay unread)."""
    path = str(tmp_path / "part-000000.parquet")
    whole = shard(path)
    fs = pafs.PyFileSystem(CountingHandler())
    meta, total = None, 0
    for u in split_units([(path, 1000)], 100):
        table, nbytes, meta = read_unit(fs, path, u["start"], u["stop"], meta=meta)
        assert table.equals(whole.select(["doc_id", "text"]).slice(u["start"], u["stop"] - u["start"]))
        total += nbytes
    counted = fs.handler.bytes_read
    assert total == counted
    assert counted == chunk_bytes(meta, range(10)) + footer_bytes(path)
    size = os.path.getsize(path)
    assert counted / size <= 1.1, (counted, size)

    # units that straddle row groups read the groups they touch, no others (still the old rows); Arrow coalesces the
    # reads of neighbouring chunks, so the unread columns' small chunks between those groups come along
    before = fs.handler.bytes_read
    table, nbytes, _ = read_unit(fs, path, 150, 420, meta=meta)
    assert table.equals(whole.select(["doc_id", "text"]).slice(150, 270))
    assert nbytes == fs.handler.bytes_read - before
    assert chunk_bytes(meta, [1, 2, 3, 4]) <= nbytes <= chunk_bytes(meta, [1, 2, 3, 4], ("doc_id", "text", "source", "line"))
    assert read_unit(fs, path, 1000, 1000, meta=meta)[0].num_rows == 0


def test_the_old_whole_shard_read_grows_with_units(tmp_path):
    """What the change removes: reading the whole shard for each of its 10 units reads it 10 times over."""
    path = str(tmp_path / "part.parquet")
    shard(path)
    fs = pafs.PyFileSystem(CountingHandler())
    for u in split_units([(path, 1000)], 100):
        pq.read_table(path, columns=["doc_id", "text"], filesystem=fs).slice(u["start"], u["stop"] - u["start"])
    assert fs.handler.bytes_read / os.path.getsize(path) > 5


class Collect(UnitActor):
    def __init__(self, fs):
        self.run = type("Run", (), {"fs": fs})()
        self.seen = []

    def write_unit(self, name, doc_ids, texts):
        self.seen.append((name, doc_ids.to_pylist(), texts))


def test_unit_actor_reports_its_bytes_and_reads_each_footer_once(tmp_path):
    """The actor (called as Ray Data calls it, without Ray) reads each shard's footer once, each unit's row group
    once, reports per unit what the filesystem counted, and hands `write_unit` the rows of the old whole-shard read."""
    paths = [str(tmp_path / f"part-{i:06d}.parquet") for i in range(3)]
    tables = [shard(p, rows=450, row_group=50, seed=i) for i, p in enumerate(paths)]
    units = split_units([(p, 450) for p in paths], 50)
    fs = pafs.PyFileSystem(CountingHandler())
    actor = Collect(fs)
    reported = 0
    for u in units:
        out = actor({k: np.array([u[k]]) for k in ("shard", "start", "stop", "name")})
        assert out["rows"].tolist() == [u["stop"] - u["start"]]
        reported += int(out["bytes"][0])
    assert reported == fs.handler.bytes_read
    metas = [pq.read_metadata(p) for p in paths]
    assert reported == sum(chunk_bytes(m, range(9)) + footer_bytes(p) for m, p in zip(metas, paths))
    snapshot = sum(os.path.getsize(p) for p in paths)
    assert reported / snapshot <= 1.1
    for (name, ids, texts), u in zip(actor.seen, units):
        old = tables[paths.index(u["shard"])].slice(u["start"], u["stop"] - u["start"])
        assert name == u["name"] and ids == old.column("doc_id").to_pylist() and texts == old.column("text").to_pylist()


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    from cqg_ray.mbqa.toy import build_toy_model

    return build_toy_model(str(tmp_path_factory.mktemp("toy") / "model"))


def test_embed_reads_its_snapshot_once(ray_local, toy_model, corpus_file, tmp_path):
    """`cqg-ray embed` on 3 JSONL files of 250 one-sentence rows, units of 50 rows on 2 actors: the snapshot parts have
    row groups of 50 rows, the units' bytes (the manifest's `unit_bytes_read`, counted through the files Parquet reads) are the
    doc_id and text chunks of every row group once plus each part's footer once per actor that read it, and at most
    1.1 x the snapshot's bytes; each unit file holds its snapshot rows in order."""
    from cqg_ray.artifacts import EMBED_CORPUS
    from cqg_ray.config import CorpusConfig, EmbedConfig
    from cqg_ray.embed import embed
    from cqg_ray.rundir import RunDir

    sentences = [json.loads(line)["text"] for line in corpus_file.read_text().splitlines()]
    rng = random.Random(0)
    src = tmp_path / "docs"
    src.mkdir()
    for f in range(3):
        (src / f"f{f}.jsonl").write_text("".join(json.dumps({"text": f"{rng.choice(sentences)} ({i})"}) + "\n" for i in range(250)))
    out = str(tmp_path / "emb")
    m = embed(toy_model, [str(src)], out, EmbedConfig(unit_rows=50, num_actors=2, batch_size=64), CorpusConfig(), progress=False)
    c = m["counts"]
    assert c["rows"] == 750 and c["units"] == 15 and c["embedded_now"] == 750

    run = RunDir(out)
    parts = [run.path(EMBED_CORPUS, n) for n in run.ls(EMBED_CORPUS, suffix=".parquet")]
    metas = [pq.read_metadata(p) for p in parts]
    assert [[mt.row_group(g).num_rows for g in range(mt.num_row_groups)] for mt in metas] == [[50] * 5] * 3
    snapshot = sum(os.path.getsize(p) for p in parts)
    chunks = sum(chunk_bytes(mt, range(5)) for mt in metas)
    footers = [footer_bytes(p) for p in parts]
    assert c["snapshot_bytes"] == snapshot
    assert chunks + sum(footers) <= c["unit_bytes_read"] <= chunks + 2 * sum(footers)
    ratio = c["unit_bytes_read"] / snapshot
    print(f"embed: units read {c['unit_bytes_read']} bytes of a {snapshot}-byte snapshot: ratio {ratio:.4f}")
    assert ratio <= 1.1

    for p in parts:
        snap = pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist()
        stem = os.path.basename(p).rsplit(".", 1)[0]
        for start in range(0, 250, 50):
            got = pq.read_table(run.path(f"emb-{stem}-{start:09d}.parquet"), columns=["doc_id"]).column("doc_id").to_pylist()
            assert got == snap[start : start + 50]


@pytest.mark.parametrize("path", ["one task", "ray data"])
def test_prepare_writes_row_groups_that_encode_units_read_once(ray_local, corpus_file, tmp_path, monkeypatch, path):
    """prepare writes equal, ordered shards in row groups of ROW_GROUP_ROWS (in one task for small parts, in Ray Data
    passes past ONE_TASK_BYTES); encode's units of that size then read each row group once: the manifest's
    unit_bytes_read is at most 1.1 x the prepared shards' bytes. (Row groups of 100 here instead of 1,000, which the
    driver reads when it writes: a tenth of the texts to encode, the same layout.)"""
    from cqg_ray.config import CorpusConfig, EncodeConfig
    from cqg_ray.corpus import stage as corpus_stage
    from cqg_ray.encode import encode
    from cqg_ray.rundir import RunDir, run_stage

    rows = 100
    monkeypatch.setattr(corpus_stage, "ROW_GROUP_ROWS", rows)
    if path == "ray data":
        monkeypatch.setattr(corpus_stage, "ONE_TASK_BYTES", -1)
    sentences = [json.loads(line)["text"] for line in corpus_file.read_text().splitlines()]
    rng = random.Random(1)
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"{rng.choice(sentences)} ({i})"}) + "\n" for i in range(240)))
    run = RunDir(str(tmp_path / "run"))
    c = CorpusConfig(paths=[str(src)], rows_per_shard=120)
    run_stage(run, "prepare", c.config_hash(), lambda ctx: corpus_stage.prepare(c, ctx))
    shards = [run.path("prepare", n) for n in run.ls("prepare", suffix=".parquet")]
    metas = [pq.read_metadata(p) for p in shards]
    assert [[mt.row_group(g).num_rows for g in range(mt.num_row_groups)] for mt in metas] == [[rows, 20]] * 2
    ids = [i for p in shards for i in pq.read_table(p, columns=["doc_id"]).column("doc_id").to_pylist()]
    assert ids == sorted(ids) and len(set(ids)) == 240
    e = EncodeConfig(batch_size=64)
    m = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, unit_rows=rows, progress=False))["counts"]
    assert m["documents"] == 240 and m["corpus_bytes"] == sum(os.path.getsize(p) for p in shards)
    ratio = m["unit_bytes_read"] / m["corpus_bytes"]
    print(f"encode: units read {m['unit_bytes_read']} bytes of {m['corpus_bytes']}-byte shards: ratio {ratio:.4f}")
    assert 0.5 < ratio <= 1.1
