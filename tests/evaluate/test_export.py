"""`cqg-ray export`: a run's trained model shipped as a folder (lives here because the trained-run fixture does)."""

import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest

from cqg_ray.cli import main
from cqg_ray.mbqa.embedder import InterpretableEmbedder


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cqg_ray")]


def test_questions_carry_their_llm_yes_rate(trained_model):
    qs = json.loads((trained_model / "questions.json").read_text())
    stats = pq.read_table(trained_model.parent / "labels" / "question_stats.parquet").to_pylist()
    by_id = {s["question_id"]: s for s in stats}
    assert len(qs) >= 1 and all(q["id"] == str(int(q["id"])) for q in qs)
    for q in qs:  # the kept questions, by their id (those that cannot be learnt left the model)
        s = by_id[int(q["id"])]
        assert q["labels"] == s["answered"]
        assert q["yes_rate"] == round(s["yes"] / s["answered"], 4)


def test_export_copies_the_model_with_its_build_record(trained_model, tmp_path, capsys):
    out = tmp_path / "models" / "tiny-ref"
    assert main(["export", str(trained_model.parent), str(out)]) == 0
    assert "cqg-ray evaluate" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "build.json", "config.json", "eval_report.json", "eval_report.md", "heads.safetensors",
                     "questions.json", "run_config.yaml", "stats.safetensors"]
    for f in ("config.json", "questions.json", "heads.safetensors", "stats.safetensors", "eval_report.json"):
        assert (out / f).read_bytes() == (trained_model / f).read_bytes(), f
    build = json.loads((out / "build.json").read_text())
    labels = json.loads((trained_model.parent / "labels" / "_manifest.json").read_text())
    assert build["stages"]["labels"]["counts"] == labels["counts"]
    q = json.loads((trained_model.parent / "questions" / "_manifest.json").read_text())["llm"]
    assert build["llm_requests"] == q["generate"]["requests"] + q["probe"]["requests"] + labels["llm"]["requests"]
    assert build["llm_prompt_tokens"] == q["generate"]["prompt_tokens"] + q["probe"]["prompt_tokens"] + labels["llm"]["prompt_tokens"] > 0
    assert "cores" in build["machine"]
    card = (out / "README.md").read_text()
    assert card.startswith("# tiny-ref\n") and 'InterpretableEmbedder.load("tiny-ref")' in card
    a, b = InterpretableEmbedder.load(str(out)), InterpretableEmbedder.load(str(trained_model))
    texts = ["A man is playing a guitar.", "Stocks fell on Monday."]
    np.testing.assert_array_equal(a.encode(texts, progress=False, output="probs"), b.encode(texts, progress=False, output="probs"))
    assert main(["export", str(trained_model.parent), str(out)]) == 2  # a model is there: not replaced silently
    assert main(["export", str(trained_model.parent), str(out), "--overwrite"]) == 0


def test_export_of_what_is_not_a_run_directory_says_what_it_is(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for name, what in (("nothing", "no such folder"), ("file.txt", "a file"), ("model", "a model folder (config.json)")):
        assert main(["export", str(tmp_path / name), str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == (f"error: {tmp_path / name} is not a cqg-ray run directory ({what}): export takes a run "
                                           "that trained a model\n")
    assert not (tmp_path / "out").exists()


def test_export_into_the_runs_own_model_folder_is_refused_and_loses_nothing(trained_model, capsys):
    before = {p.name: p.read_bytes() for p in trained_model.iterdir() if p.is_file()}
    assert main(["export", str(trained_model.parent), str(trained_model), "--overwrite"]) == 2
    assert "is the run's own model folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in trained_model.iterdir() if p.is_file()} == before
    (trained_model.parent / "a-file").write_text("x")
    assert main(["export", str(trained_model.parent), str(trained_model.parent / "a-file")]) == 2
    assert "is a file: give a folder" in capsys.readouterr().err
    (trained_model.parent / "a-file").unlink()


def test_export_over_a_model_leaves_none_of_the_replaced_models_files(trained_model, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_model.parent, run, ignore=shutil.ignore_patterns("_train"))
    out = tmp_path / "shipped"
    assert main(["export", str(run), str(out)]) == 0
    assert (out / "eval_report.json").exists()
    (run / "model" / "eval_report.json").unlink()
    (run / "model" / "eval_report.md").unlink()
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    assert not (out / "eval_report.json").exists() and not (out / "eval_report.md").exists()
    assert (out / "heads.safetensors").read_bytes() == (run / "model" / "heads.safetensors").read_bytes()
    # a model that does not load is refused before anything is written: the shipped one stays whole
    (out / "evaluation").mkdir()
    (out / "evaluation" / "report.md").write_text("kept")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    heads = (run / "model" / "heads.safetensors").read_bytes()
    (run / "model" / "heads.safetensors").unlink()
    assert main(["export", str(run), str(out), "--overwrite"]) == 2
    (run / "model" / "heads.safetensors").write_bytes(heads)
    questions = (run / "model" / "questions.json").read_text()
    (run / "model" / "questions.json").write_text(questions[: len(questions) // 2])
    assert main(["export", str(run), str(out), "--overwrite"]) == 2
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    (run / "model" / "questions.json").write_text(questions)
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    assert (out / "evaluation" / "report.md").read_text() == "kept"  # what export does not write stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "shipped"]  # no half-written or replaced folder left


def test_export_says_when_the_runs_model_is_stale_and_refuses_a_config_of_another_shape(trained_model, tmp_path, capsys, caplog):
    import shutil

    from cqg_ray.config import config_from_dict, dump_config, stage_hash
    from cqg_ray.rundir import RunDir

    run_state_of_model = lambda run, cfg: RunDir(str(run)).state("model", stage_hash(cfg, "model")).state  # noqa: E731
    run = tmp_path / "run"
    shutil.copytree(trained_model.parent, run, ignore=shutil.ignore_patterns("_train"))
    cfg = config_from_dict({"run_dir": str(run), "train": {"epochs": 7}})  # not the config the fixture's model was trained with
    assert run_state_of_model(run, cfg) == "stale"
    (run / "config.yaml").write_text(dump_config(cfg))
    assert main(["export", str(run), str(tmp_path / "a")]) == 0
    assert any("the run's model stage is stale (config changed): its run_config.yaml does not rebuild the exported model" in m for m in warnings_of(caplog))
    (run / "config.yaml").write_text("- a list\n")
    assert main(["export", str(run), str(tmp_path / "b")]) == 2
    assert f"{run / 'config.yaml'}: the top level must be a mapping of sections" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_swap_that_fails_puts_the_replaced_model_back(trained_model, tmp_path, monkeypatch):
    import os
    import shutil

    from cqg_ray import export

    run = tmp_path / "run"
    shutil.copytree(trained_model.parent, run, ignore=shutil.ignore_patterns("_train"))
    out = tmp_path / "shipped"
    export.export_model(str(run), str(out))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real = os.replace

    def failing(src, dst):
        if ".export-" in str(src):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(export.os, "replace", failing)
    with pytest.raises(OSError, match="disk full"):
        export.export_model(str(run), str(out), overwrite=True)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "shipped"]


def test_an_export_killed_during_its_swap_is_put_right_by_the_next(trained_model, tmp_path, capsys, caplog):
    """SIGKILL between the swap's two renames leaves OUT missing, the model it replaced beside it and the new folder
    unfinished: the next export puts the replaced model back (so --overwrite is asked for again) and clears both."""
    import os
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_model.parent, run, ignore=shutil.ignore_patterns("_train"))
    out = tmp_path / "shipped"
    assert main(["export", str(run), str(out)]) == 0
    assert warnings_of(caplog) == []  # the run's model stage is current under its config: nothing to warn of
    (out / "evaluation").mkdir()
    (out / "evaluation" / "report.md").write_text("kept")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    os.replace(out, tmp_path / "shipped.replaced-0000abcd")  # the state a kill between the renames leaves
    (tmp_path / "shipped.export-0000dcba").mkdir()
    (tmp_path / "shipped.export-0000dcba" / "heads.safetensors").write_bytes(b"half")
    assert main(["export", str(run), str(out)]) == 2
    assert "already holds a model" in capsys.readouterr().err
    assert warnings_of(caplog) == [f"{out} was missing after an interrupted export: the model it was replacing is back in place"]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "shipped"]
    # killed after the second rename, before the replaced folder was removed: the next export removes it
    (tmp_path / "shipped.replaced-0000eeee").mkdir()
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "shipped"]
    assert (out / "evaluation" / "report.md").read_text() == "kept"


def test_export_into_the_run_directory_or_a_folder_above_it_is_refused_and_writes_nothing(tmp_path, toy_encoder, capsys):
    """`cqg-ray export RUN RUN` copied the whole run into RUN.export-*, swapped it in and left the model's files
    beside the stages (a folder above the run: every run under it copied)."""
    from tests.conftest import toy_run

    run = tmp_path / "runs" / "r"
    toy_run(run, toy_encoder)
    capsys.readouterr()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for out in (run, f"{run}/", tmp_path / "runs"):
        assert main(["export", str(run), str(out), "--overwrite"]) == 2
        assert capsys.readouterr().err == (f"error: {out} is the run directory or a folder that holds it: export to a folder "
                                           "outside the run\n")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert main(["export", str(run), str(run / "shipped")]) == 0  # a folder inside the run is not refused
    assert (run / "shipped" / "config.json").is_file()


def test_export_under_a_file_is_one_line_and_writes_nothing(tmp_path, toy_encoder, capsys):
    """OUT below a file was a NotADirectoryError traceback from making OUT.export-*."""
    from tests.conftest import toy_run

    run = tmp_path / "r"
    toy_run(run, toy_encoder)
    capsys.readouterr()
    (tmp_path / "notes.txt").write_text("x")
    for out in (tmp_path / "notes.txt" / "m", tmp_path / "notes.txt" / "a" / "m"):
        assert main(["export", str(run), str(out)]) == 2
        assert capsys.readouterr().err == f"error: {tmp_path / 'notes.txt'} is a file: give a folder path to export the model to\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "r"]


def test_export_to_a_uri_is_refused_and_makes_no_local_folder(tmp_path, toy_encoder, capsys, monkeypatch):
    """OUT s3://bucket/m was written to ./s3:/bucket/m and reported as exported to s3://bucket/m."""
    from tests.conftest import toy_run

    run = tmp_path / "r"
    toy_run(run, toy_encoder)
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    for out in ("s3://bucket/models/m", "file:///tmp/m"):
        assert main(["export", str(run), out]) == 2
        assert capsys.readouterr().err == f"error: {out}: export writes a local folder; give a local path, and copy the folder to {out} afterwards\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_export_over_another_model_leaves_its_evaluation_out_and_a_folder_of_other_files_is_refused(trained_model, tmp_path, toy_encoder,
                                                                                                      capsys, caplog):
    """The replaced model's evaluation/ stayed beside a model with other questions and heads; a folder that held no model
    (an embed output) took the model's files beside its own."""
    import shutil

    from tests.conftest import toy_run

    run, toy = tmp_path / "run", tmp_path / "toy"
    shutil.copytree(trained_model.parent, run, ignore=shutil.ignore_patterns("_train"))
    toy_run(toy, toy_encoder)
    out = tmp_path / "shipped"
    assert main(["export", str(run), str(out)]) == 0
    (out / "evaluation").mkdir()
    (out / "evaluation" / "report.md").write_text("measured the first model")
    (out / "NOTES.md").write_text("mine")
    assert main(["export", str(run), str(out), "--overwrite"]) == 0  # the same heads again: what measured them stays
    assert (out / "evaluation" / "report.md").read_text() == "measured the first model"
    assert main(["export", str(toy), str(out), "--overwrite"]) == 0
    assert not (out / "evaluation").exists() and (out / "NOTES.md").read_text() == "mine"
    assert (out / "heads.safetensors").read_bytes() == (toy / "model" / "heads.safetensors").read_bytes()
    assert f"{out}/evaluation/ measured the model being replaced (other questions or heads): left out" in caplog.text
    # a folder of other files (here an embed output's) is refused and left as it was; an empty one is taken
    emb = tmp_path / "emb"
    emb.mkdir()
    (emb / "_manifest.json").write_text("{}")
    (emb / "emb-part-000000-000000000.parquet").write_bytes(b"PAR1")
    capsys.readouterr()
    assert main(["export", str(run), str(emb)]) == 2
    assert capsys.readouterr().err == (f"error: {emb} holds other files than a model (_manifest.json, emb-part-000000-000000000.parquet): "
                                       "export to a new or empty folder, or over a model folder with --overwrite\n")
    assert sorted(p.name for p in emb.iterdir()) == ["_manifest.json", "emb-part-000000-000000000.parquet"]
    (tmp_path / "empty").mkdir()
    assert main(["export", str(run), str(tmp_path / "empty")]) == 0
