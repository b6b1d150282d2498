import pyarrow as pa
import pytest

from cqg_ray.rundir import ArtifactError, RunDir, format_status, run_stage, status_table


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


def test_remove_partial_deletes_only_interrupted_writes(tmp_path):
    run = RunDir(str(tmp_path))
    run.write_json("encode/done.json", {"v": 1})
    (tmp_path / "encode" / "emb-a.parquet.tmp-1a2b3c4d").write_bytes(b"half")
    (tmp_path / "encode" / "_manifest.json.tmp-00ff00ff").write_bytes(b"{")
    run.remove_partial("encode")
    assert run.ls("encode") == ["done.json"]
    run.remove_partial("missing")  # no folder: nothing to do


def test_pending_units_skips_written_and_clears_strays_and_partial_writes(tmp_path):
    from cqg_ray.units import pending_units, split_units

    run = RunDir(str(tmp_path))
    units = split_units([("prepare/part-0.parquet", 25)], unit_rows=10)
    assert [u["name"] for u in units] == ["emb-part-0-000000000.parquet", "emb-part-0-000000010.parquet", "emb-part-0-000000020.parquet"]
    run.write_bytes("encode/emb-part-0-000000000.parquet", b"x")  # written
    run.write_bytes("encode/emb-part-0-000000005.parquet", b"x")  # another plan's unit
    (tmp_path / "encode" / "emb-part-0-000000010.parquet.tmp-1a2b3c4d").write_bytes(b"half")  # interrupted
    assert [u["name"] for u in pending_units(run, "encode", units)] == ["emb-part-0-000000010.parquet", "emb-part-0-000000020.parquet"]
    assert run.ls("encode") == ["emb-part-0-000000000.parquet"]
