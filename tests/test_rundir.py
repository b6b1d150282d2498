import time

import pyarrow as pa
import pytest

from cqg_ray.rundir import ArtifactError, RunDir, run_stage
from cqg_ray.status import format_status, status_table


def _writer(value):
    def fn(ctx):
        ctx.run.write_json(f"{ctx.stage}/out.json", {"v": value})
        ctx.counts["v"] = value
    return fn


def test_done_stale_missing(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    assert run.state("prepare").state == "missing"
    run_stage(run, "prepare", "h1", _writer(1))
    assert run.state("prepare", "h1").state == "done"
    assert run.state("prepare", "h2").state == "stale"
    run_stage(run, "encode", "e1", _writer(2))
    assert run.state("encode", "e1").state == "done"
    # changing prepare's config reruns it; its new fingerprint makes encode stale
    run_stage(run, "prepare", "h2", _writer(3))
    st = run.state("encode", "e1")
    assert st.state == "stale"
    assert st.reason == "input 'prepare' changed"


def test_a_finished_stage_refused_before_it_writes_keeps_its_manifest(tmp_path):
    """A rerun of a finished stage that a ValueError refuses (a config value, a corpus path) before it writes anything
    leaves the stage as it was: its manifest back (stale against the refused config, done against its own), where the
    manifest was removed first and the finished work shown as missing. A stage that wrote before failing, or that was
    interrupted, stays without one."""
    from cqg_ray.config import ConfigError

    run = RunDir(str(tmp_path / "r"))
    first = run_stage(run, "prepare", "h1", _writer(1))

    def refused(ctx):
        raise ConfigError("cluster.k=500 is larger than the corpus (400 documents): lower cluster.k")

    with pytest.raises(ConfigError):
        run_stage(run, "prepare", "h2", refused)
    assert run.manifest("prepare") == first and run.state("prepare", "h1").state == "done"
    assert run.state("prepare", "h2").state == "stale"

    def wrote_then_refused(ctx):
        ctx.run.write_json(f"{ctx.stage}/out.json", {"v": 2})
        raise ConfigError("a bad line in the second file")

    with pytest.raises(ConfigError):
        run_stage(run, "prepare", "h2", wrote_then_refused)
    assert run.manifest("prepare") is None  # its folder changed: nothing vouches for it
    run_stage(run, "prepare", "h1", _writer(1))

    def interrupted(ctx):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_stage(run, "prepare", "h2", interrupted)
    assert run.manifest("prepare") is None


def test_a_stage_finished_after_interruptions_counts_every_attempts_seconds(tmp_path):
    """A stage interrupted and resumed showed only its last attempt's seconds (the demo's questions: 426.9 where the
    stage had run longer); the attempts that end unfinished are noted in its folder (_attempts.json, for this config)
    and the manifest and the status count them. A kill -9 leaves no note: that attempt is not counted."""
    run = RunDir(str(tmp_path / "r"))

    def slow_then(outcome):
        def fn(ctx):
            time.sleep(0.05)
            if outcome is not None:
                raise outcome
            ctx.run.write_json(f"{ctx.stage}/out.json", {"v": 1})
        return fn

    for outcome in (KeyboardInterrupt(), RuntimeError("an actor died")):
        with pytest.raises(type(outcome)):
            run_stage(run, "prepare", "h", slow_then(outcome))
    note = run.read_json("prepare/_attempts.json")
    assert note["config_hash"] == "h" and len(note["seconds"]) == 2 and all(s >= 0.05 for s in note["seconds"])
    m = run_stage(run, "prepare", "h", slow_then(None))
    assert m["earlier_attempts_s"] == note["seconds"] and not run.exists("prepare", "_attempts.json")
    row = status_table(run, {"prepare": "h"})[0]
    assert (row["attempts"], row["seconds"]) == (3, pytest.approx(m["seconds"] + sum(note["seconds"])))
    assert format_status(run, {"prepare": "h"}).splitlines()[2].split() == ["prepare", "done", f"{row['seconds']:.1f}", "(seconds", "over", "3", "runs)"]
    with pytest.raises(KeyboardInterrupt):  # an attempt at another config: its own count
        run_stage(run, "prepare", "h2", slow_then(KeyboardInterrupt()))
    assert "earlier_attempts_s" not in run_stage(run, "prepare", "h3", slow_then(None))
    (tmp_path / "r" / "prepare" / "_attempts.json").write_text("{torn")  # an unreadable note: nothing counted, the stage runs
    assert "earlier_attempts_s" not in run_stage(run, "prepare", "h4", slow_then(None))


def test_skip_when_done(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    calls = []
    def fn(ctx):
        calls.append(1)
    run_stage(run, "prepare", "h", fn)
    run_stage(run, "prepare", "h", fn)
    assert len(calls) == 1
    run_stage(run, "prepare", "h", fn, force=True)
    assert len(calls) == 2


def test_killed_stage_leaves_no_manifest(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    def boom(ctx):
        ctx.run.write_json(f"{ctx.stage}/partial.json", {})
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_stage(run, "prepare", "h", boom)
    assert run.state("prepare", "h").state == "missing"
    assert run.exists("prepare", "partial.json")


def test_missing_input_is_a_clear_error(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    with pytest.raises(ArtifactError, match="stage 'prepare' has not finished"):
        run_stage(run, "encode", "e", _writer(1))


def test_corrupt_manifest_means_not_done(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "prepare", "h", _writer(1))
    (tmp_path / "r" / "prepare" / "_manifest.json").write_text("{not json")
    assert run.state("prepare", "h").state == "missing"



def test_a_manifest_of_another_shape_means_not_done_and_status_still_prints(tmp_path, caplog):
    import json

    run = RunDir(str(tmp_path / "r"))
    good = run_stage(run, "prepare", "h", _writer(1))
    path = tmp_path / "r" / "prepare" / "_manifest.json"
    for body, says in [([], "a JSON list, not an object"), ("x", "a JSON str, not an object"), ({**good, "inputs": []}, "inputs is list"),
                       ({**good, "counts": [1]}, "counts is list"), ({**good, "seconds": "1.5"}, "seconds is str"),
                       ({**good, "outputs": {"parquet_rows": {"a.parquet": "7"}}}, "outputs.parquet_rows is not a mapping of row counts")]:
        path.write_text(json.dumps(body))
        caplog.clear()
        assert run.state("prepare", "h").state == "missing", body
        assert f"is not a stage manifest ({says}): the stage counts as not done" in caplog.text
        assert format_status(run, {"prepare": "h"}).splitlines()[2].split() == ["prepare", "missing", "-"]
        assert run.manifest("prepare") is None and caplog.text.count("is not a stage manifest") == 1  # said once, not at every read


def test_manifest_contents(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    m = run_stage(run, "prepare", "h", _writer(7))
    assert m["stage"] == "prepare"
    assert m["config_hash"] == "h"
    assert m["counts"] == {"v": 7}
    assert m["inputs"] == {}
    assert "ray" in m["versions"] and "python" in m["versions"]
    rows = {r["stage"]: r for r in status_table(run)}
    assert rows["prepare"]["state"] == "done"
    assert rows["encode"]["state"] == "missing"


def test_fsspec_uri(tmp_path):
    """Any fsspec URI works: memory:// is not a pyarrow filesystem, so it goes through FSSpecHandler."""
    run = RunDir("memory://cqg-test/run1")
    run.write_table("prepare/t.parquet", pa.table({"a": [1, 2]}))
    run.write_json("prepare/x.json", {"k": 1})
    assert run.read_table("prepare/t.parquet").column("a").to_pylist() == [1, 2]
    assert run.read_json("prepare/x.json") == {"k": 1}
    assert run.ls("prepare") == ["t.parquet", "x.json"]
    run_stage(run, "prepare", "h", _writer(1))
    assert run.state("prepare", "h").state == "done"


def test_corrupt_parquet(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    run.write_bytes("x/t.parquet", b"garbage")
    with pytest.raises(ArtifactError, match="corrupt Parquet"):
        run.read_table("x/t.parquet")
    with pytest.raises(ArtifactError, match="missing artifact"):
        run.read_table("nope.parquet")



def test_a_parquet_file_damaged_in_place_is_caught_by_its_page_checksums(tmp_path):
    """Bytes flipped inside a data page, the footer whole (row counts match the manifest): the pages' CRCs catch it."""
    import numpy as np

    from cqg_ray.artifacts import embedding_batches

    run = RunDir(str(tmp_path / "r"))
    emb = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    table = pa.table({"doc_id": [f"d{i}" for i in range(2000)], "embedding": pa.FixedSizeListArray.from_arrays(emb.ravel(), 16)})
    run.write_table("encode/emb-0.parquet", table)
    path = tmp_path / "r" / "encode" / "emb-0.parquet"
    assert run.read_table("encode/emb-0.parquet").equals(table)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupt Parquet artifact .*emb-0.parquet.*CRC"):
        run.read_table("encode/emb-0.parquet")
    with pytest.raises(ArtifactError, match="corrupt Parquet artifact .*emb-0.parquet.*CRC"):
        list(embedding_batches([run.path("encode", "emb-0.parquet")], run.fs, 500))


def test_require_names_the_stage_command(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    with pytest.raises(ArtifactError, match="stage 'evaluation' has not finished in .*: run `cqg-ray evaluate-run ...` first"):
        run.require("evaluation")
    with pytest.raises(ArtifactError, match="run `cqg-ray cqg ...` first"):
        run.require("questions")


def test_run_stage_records_the_registry_inputs(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "prepare", "p", _writer(1))
    run_stage(run, "encode", "e", _writer(2))
    m = run_stage(run, "cluster", "c", _writer(3))
    assert m["inputs"] == {"encode": run.fingerprint("encode")}
    with pytest.raises(ArtifactError, match="stage 'labels' has not finished"):
        run_stage(run, "model", "m", _writer(4))


def test_format_status(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "prepare", "p", _writer(1))
    run_stage(run, "encode", "e", _writer(2))
    lines = format_status(run, {"prepare": "p", "encode": "e2"}).splitlines()
    assert lines[0] == f"run: {tmp_path / 'r'}"
    assert lines[1] == "stage        state      seconds  counts"
    assert lines[2].split() == ["prepare", "done", lines[2].split()[2], "v=1"]
    assert lines[3].split()[:2] == ["encode", "stale"] and lines[3].endswith("v=2  (config changed)")
    assert [ln.split()[:3] for ln in lines[4:]] == [[s, "missing", "-"] for s in ("cluster", "questions", "labels", "model", "evaluation")]


def test_format_status_lines_up_its_columns_for_every_state_word(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "prepare", "p", _writer(1))
    lines = format_status(run, {"prepare": "p"}, live=("encode", "interrupted", "encode: 10/300 text (5s ago)")).splitlines()
    assert lines[1] == "stage        state         seconds  counts"
    assert lines[2].split()[:2] == ["prepare", "done"] and lines[2].index("v=1") == lines[1].index("counts") == 36
    assert lines[3] == "encode       interrupted         -  encode: 10/300 text (5s ago)"
    assert lines[4] == "cluster      missing             -  "
    lines = format_status(run, {"prepare": "p"}, live=("encode", "running", "encode: 10/300 text")).splitlines()
    assert lines[1] == "stage        state      seconds  counts"
    assert lines[3] == "encode       running          -  encode: 10/300 text"


def test_remove_partial_deletes_only_interrupted_writes(tmp_path):
    run = RunDir(str(tmp_path))
    run.write_json("encode/done.json", {"v": 1})
    (tmp_path / "encode" / "emb-a.parquet.tmp-1a2b3c4d").write_bytes(b"half")
    (tmp_path / "encode" / "_manifest.json.tmp-00ff00ff").write_bytes(b"{")
    run.remove_partial("encode")
    assert run.ls("encode") == ["done.json"]
    run.remove_partial("missing")  # no folder: nothing to do


def test_pending_units_skips_written_and_clears_strays_damaged_and_partial_writes(tmp_path):
    from cqg_ray.units import pending_units, split_units

    run = RunDir(str(tmp_path))
    units = split_units([("prepare/part-0.parquet", 25)], unit_rows=10)
    assert [u["name"] for u in units] == ["emb-part-0-000000000.parquet", "emb-part-0-000000010.parquet", "emb-part-0-000000020.parquet"]
    run.write_table("encode/emb-part-0-000000000.parquet", pa.table({"doc_id": [str(i) for i in range(10)]}))  # written
    run.write_bytes("encode/emb-part-0-000000005.parquet", b"x")  # another plan's unit
    (tmp_path / "encode" / "emb-part-0-000000010.parquet.tmp-1a2b3c4d").write_bytes(b"half")  # interrupted
    run.write_bytes("encode/emb-part-0-000000020.parquet", b"x")  # damaged: not Parquet
    assert [u["name"] for u in pending_units(run, "encode", units)] == ["emb-part-0-000000010.parquet", "emb-part-0-000000020.parquet"]
    assert run.ls("encode") == ["emb-part-0-000000000.parquet"]
    run.write_table("encode/emb-part-0-000000010.parquet", pa.table({"doc_id": ["a", "b"]}))  # other rows than its unit's 10
    assert [u["name"] for u in pending_units(run, "encode", units)] == ["emb-part-0-000000010.parquet", "emb-part-0-000000020.parquet"]


def _units(n_files, rows=5):
    def fn(ctx):
        for i in range(n_files):
            ctx.run.write_table(f"{ctx.stage}/emb-part-{i:06d}-000000000.parquet", pa.table({"doc_id": [f"{i}-{j}" for j in range(rows)]}))
        ctx.counts["units"] = n_files
    return fn


def test_manifest_records_the_parquet_outputs(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    m = run_stage(run, "encode", "e1", _units(2), deps=[])
    assert m["outputs"] == {"parquet_rows": {"emb-part-000000-000000000.parquet": 5, "emb-part-000001-000000000.parquet": 5}}
    assert RunDir(str(tmp_path / "r")).require("encode")["fingerprint"] == m["fingerprint"]


def test_extra_units_behind_the_manifest_are_named(tmp_path):
    from cqg_ray.rundir import StageMismatch

    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "encode", "e1", _units(2), deps=[])
    _units(4)(type("C", (), {"run": run, "stage": "encode", "counts": {}})())  # a second writer's units
    fresh = RunDir(str(tmp_path / "r"))
    with pytest.raises(StageMismatch) as e:
        fresh.require("encode")
    msg = str(e.value)
    assert msg.startswith(f"stage 'encode' in {tmp_path / 'r' / 'encode'} does not match its manifest: 2 Parquet file(s) not in its manifest "
                          "(emb-part-000002-000000000.parquet, emb-part-000003-000000000.parquet) (20 rows now, 10 when it finished).")
    assert msg.endswith("redo it: `cqg-ray run --force encode` (or `cqg-ray encode --force`)")
    with pytest.raises(StageMismatch):  # a rerun does not skip it as done either
        run_stage(fresh, "encode", "e1", _units(2), deps=[])
    rows = {r["stage"]: r for r in status_table(fresh)}
    assert rows["encode"]["state"] == "changed" and rows["encode"]["reason"].startswith("2 Parquet file(s) not in its manifest")
    assert "changed: the stage's folder no longer matches its manifest; redo it: `cqg-ray run --force encode`" in format_status(fresh)
    m = run_stage(fresh, "encode", "e1", _units(2), deps=[], force=True)  # --force: redone, the manifest records the folder anew
    assert len(m["outputs"]["parquet_rows"]) == 4  # (the real encode removes stray units first: cqg_ray.units.pending_units)
    assert RunDir(str(tmp_path / "r")).require("encode")["fingerprint"] == m["fingerprint"]


def test_missing_rows_and_missing_files_are_named(tmp_path):
    from cqg_ray.rundir import StageMismatch

    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "prepare", "p1", _units(3, rows=7), deps=[])
    run.write_table("prepare/emb-part-000001-000000000.parquet", pa.table({"doc_id": ["a", "b"]}))
    run.rm("prepare", "emb-part-000002-000000000.parquet")
    with pytest.raises(StageMismatch) as e:
        RunDir(str(tmp_path / "r")).require("prepare")
    assert ("does not match its manifest: 1 file(s) of its manifest missing (emb-part-000002-000000000.parquet); "
            "emb-part-000001-000000000.parquet has 2 rows, its manifest 7 (9 rows now, 21 when it finished)") in str(e.value)
    assert "`cqg-ray run --force prepare` (or `cqg-ray prepare --force`)" in str(e.value)


def test_a_manifest_without_outputs_is_trusted(tmp_path):
    import json

    run = RunDir(str(tmp_path / "r"))
    run_stage(run, "encode", "e1", _units(1), deps=[])
    p = tmp_path / "r" / "encode" / "_manifest.json"
    m = json.loads(p.read_text())
    del m["outputs"]
    p.write_text(json.dumps(m))
    _units(3)(type("C", (), {"run": run, "stage": "encode", "counts": {}})())
    assert RunDir(str(tmp_path / "r")).require("encode")["stage"] == "encode"  # written by an older cqg-ray: not checked


def test_documents_digest_and_check(tmp_path):
    from cqg_ray.rundir import documents_digest

    assert documents_digest(["a", "b", "c"]) == documents_digest(["c", "a", "b"])
    assert documents_digest(["a", "b"]).startswith("2:") and documents_digest(["a", "b"]) != documents_digest(["a", "c"])
    run = RunDir(str(tmp_path / "r"))
    run.write_manifest("prepare", "h", [], {}, 1.0, extra={"documents_digest": documents_digest(["a", "b", "c"])})
    run.check_documents("encode", documents_digest(["b", "c", "a"]), "prepare")
    with pytest.raises(ArtifactError, match=r"^stage 'encode' wrote 6 documents, not the 3 that 'prepare' holds: prepare/ or encode/ was changed"):
        run.check_documents("encode", documents_digest(list("abcabc")), "prepare")
    with pytest.raises(ArtifactError, match=r"not the 3 that 'prepare' holds \(the same count, other documents\)"):
        run.check_documents("encode", documents_digest(list("abd")), "prepare")


def test_embed_output_changed_behind_its_manifest(tmp_path):
    from cqg_ray.rundir import StageMismatch

    run = RunDir(str(tmp_path / "out"))
    run.write_table("emb-part-000000-000000000.parquet", pa.table({"doc_id": ["a"]}))
    run.write_manifest("", "h", [], {}, 1.0)
    run.write_table("emb-part-000001-000000000.parquet", pa.table({"doc_id": ["b"]}))
    with pytest.raises(StageMismatch, match=r"redo the changed units: delete the folder's _manifest.json \(and any unit file that "
                                            r"does not belong\), then run the same `cqg-ray embed \.\.\.` command: it writes the "
                                            r"missing units again and keeps the others \(--force redoes them all\)$"):
        RunDir(str(tmp_path / "out")).verify("")


def test_write_tables_streams_tables_into_one_file_cast_to_the_schema(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    parts = (pa.table({"k": [f"{i}{j}" for j in range(i)], "n": pa.array(range(i), pa.int32())}) for i in (1, 2, 3))
    assert run.write_tables("stage/all.parquet", schema, parts) == 6
    t = run.read_table("stage/all.parquet")
    assert t.schema == schema and t.column("k").to_pylist() == ["10", "20", "21", "30", "31", "32"]
    assert run.ls("stage") == ["all.parquet"]  # the temp file was renamed, nothing left beside it
    assert run.write_tables("stage/none.parquet", schema, iter(())) == 0 and run.read_table("stage/none.parquet").num_rows == 0


def test_a_uri_that_neither_pyarrow_nor_fsspec_opens_is_an_artifact_error():
    """Both reasons are said (pyarrow's first: on an s3:// URI it is the bucket or the credentials, not fsspec's missing
    s3fs); the CLI prints it as an error (exit 2), not a traceback."""
    from cqg_ray.rundir import resolve

    with pytest.raises(ArtifactError) as e:
        resolve("foo://x/run")
    assert str(e.value) == "cannot open foo://x/run: Unrecognized filesystem type in URI: foo://x/run; Protocol not known: foo"
    assert resolve("memory://x/run")[1] == "/x/run"  # fsspec's own filesystems still open
