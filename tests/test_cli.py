"""The CLI as users call it: help, config errors, a killed encode that resumes, status."""

import os
from pathlib import Path
import re
import signal
import subprocess
import sys
import time

import pytest

import cqg_ray.cli as cli_module
from cqg_ray.cli import build_parser, cmd_stage, main

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "CQG_RAY_PROGRESS": "0"}


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "cqg_ray.cli", *args], env=ENV, capture_output=True, text=True, **kw)


def test_help_lists_stages(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("run", "prepare", "encode", "cluster", "status"):
        assert cmd in out


def test_every_stage_is_a_command_with_its_help(capsys):
    from cqg_ray import stages

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for s in stages.STAGES:
        assert f"{s.command} {' '.join(s.help.split())}" in out
    args = build_parser().parse_args(["evaluate-run", "-r", "x"])
    assert args.stage == "evaluation" and args.func is cmd_stage


def test_run_help_names_the_job_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("--config", "--set", "--until", "--force", "--address", "ray job submit", "python -m cqg_ray.cli run", "resume"):
        assert word in out


def test_run_refuses_to_force_a_stage_after_until(tmp_path, capsys):
    """--force of a stage --until stops before would be ignored: said, before the lease and Ray."""
    run = tmp_path / "r"
    assert main(["run", "--run-dir", str(run), "--until", "encode", "--force", "cluster", "labels", "--force", "prepare"]) == 2
    assert capsys.readouterr().err == "error: --force cluster labels: after --until encode, so it would not run; drop it or move --until\n"
    assert not run.exists()
    run.mkdir()  # an empty folder: the same, and it stays empty
    assert main(["train", "--run-dir", str(run)]) == 2
    assert capsys.readouterr().err == f"error: stage 'labels' has not finished in {run}: run `cqg-ray label ...` first\n"
    assert list(run.iterdir()) == []


def test_a_stage_on_a_run_directory_that_does_not_exist_makes_none(tmp_path, capsys):
    """A mistyped --run-dir: the stage's first input is said missing, and nothing is created (no config.yaml, no lease)."""
    run = tmp_path / "typo"
    assert main(["cluster", "--run-dir", str(run)]) == 2
    assert capsys.readouterr().err == f"error: stage 'encode' has not finished in {run}: run `cqg-ray encode ...` first\n"
    assert not run.exists()


def test_a_stage_or_run_on_a_model_folder_or_a_file_is_refused_and_writes_nothing_into_it(tmp_path, capsys):
    """A model folder given as --run-dir got the lease's lock and a config.yaml (then looked like a run directory);
    a file as --run-dir was a FileExistsError traceback from the lease."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "file.txt").write_text("x")
    for argv in (["train", "-r", str(model)], ["label", "--set", f"run_dir={model}"], ["run", "-r", str(model)]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == (f"error: {model} is not a cqg-ray run directory (a model folder (config.json)): give a "
                                           "run directory (--run-dir), or a new folder to start one\n")
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    for argv in (["train", "-r", str(tmp_path / "file.txt")], ["run", "-r", str(tmp_path / "file.txt")]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == (f"error: {tmp_path / 'file.txt'} is not a cqg-ray run directory (a file): give a "
                                           "run directory (--run-dir), or a new folder to start one\n")
    assert (tmp_path / "file.txt").read_text() == "x"


def test_a_missing_local_model_path_is_a_config_error_before_the_lease_and_ray(tmp_path, capsys, monkeypatch):
    """encode.model=/nonexistent/dir: said in one line (exit 2) before anything is made, not by the encoder actors' deaths."""
    import cqg_ray.pipeline as pipeline

    monkeypatch.setattr(pipeline, "init_ray", lambda cfg: pytest.fail("Ray started"))
    run = tmp_path / "r"
    said = "(a local path; give one that exists, or a hub or bundled: name)"
    assert main(["run", "--run-dir", str(run), "--set", "encode.model=/nonexistent/dir"]) == 2
    assert capsys.readouterr().err == f"error: no such file or folder: encode.model=/nonexistent/dir {said}\n"
    assert not run.exists()
    run.mkdir()
    (run / "prepare").mkdir()
    (run / "prepare" / "_manifest.json").write_text("{}")
    assert main(["encode", "--set", f"run_dir={run}", "--set", "encode.model=~/no-such-encoder-here"]) == 2
    assert capsys.readouterr().err == f"error: no such file or folder: encode.model=~/no-such-encoder-here {said}\n"
    assert sorted(p.name for p in run.iterdir()) == ["prepare"]  # no lease, no config.yaml


def test_a_stage_command_stopped_by_sigterm_unwinds_and_gives_back_its_lease(tmp_path, monkeypatch, capsys):
    """`ray job stop` sends SIGTERM: a stage command unwinds (exit 143) as `run` does, so ledgers flush and the lease goes."""
    import cqg_ray.pipeline as pipeline
    from cqg_ray.lease import take_lease

    seen = []

    def stopped(cfg, stage, force=False):
        seen.append(stage)
        # the installed handler, called as the signal calls it: a real SIGTERM to the test's own process took down its
        # xdist worker at times (CI at stops 89 and 91), where an earlier test's Ray had left its state behind
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        raise AssertionError("SIGTERM did not unwind the stage")

    monkeypatch.setattr(pipeline, "init_ray", lambda cfg: None)
    monkeypatch.setattr(pipeline, "run_one", stopped)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--run-dir", str(tmp_path / "r"), "--set", f"corpus.paths=[{Path(__file__).parent / 'fixtures' / 'corpus_400.jsonl'}]"])
    assert e.value.code == 143 and seen == ["prepare"] and signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err.endswith("stopped: run the same command again to resume\n")  # as Ctrl-C's line
    with take_lease(str(tmp_path / "r"), "cqg-ray prepare"):  # given back: a second writer takes it
        pass


def sigterm_in_ray_get(*args, **kwargs):
    """SIGTERM while the main thread waits in ``ray.get``: Ray runs the handler there and raises its SystemExit(143) on
    as a SystemExit(1) (``check_signals``: any code but 0 is an "unexpected system exit")."""
    try:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the installed handler, called as the signal calls it
    except SystemExit:
        raise SystemExit(1) from None
    raise AssertionError("SIGTERM did not unwind")


def test_sigterm_that_lands_in_ray_get_still_exits_143(tmp_path, monkeypatch, capsys):
    """A SIGTERM that came while a stage waited in ``ray.get`` (the model stage's training task, a cluster task) exited
    1, the status of a failed stage, where it stopped the run: it exits 143 as every other SIGTERM does, `run` and the
    stage commands alike."""
    import ray

    import cqg_ray.pipeline as pipeline

    corpus = Path(__file__).parent / "fixtures" / "corpus_400.jsonl"
    monkeypatch.setattr(pipeline, "init_ray", lambda cfg: None)
    monkeypatch.setattr(pipeline, "run_pipeline", sigterm_in_ray_get)
    monkeypatch.setattr(pipeline, "run_one", sigterm_in_ray_get)
    monkeypatch.setattr(ray, "cluster_resources", dict)
    monkeypatch.setattr(ray, "nodes", list)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["run", "--run-dir", str(tmp_path / "r"), "--set", f"corpus.paths=[{corpus}]"]) == 143
    assert "stopped after 0s: run (or submit) the same command again to resume" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--run-dir", str(tmp_path / "s"), "--set", f"corpus.paths=[{corpus}]"])
    assert e.value.code == 143 and signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == "stopped: run the same command again to resume\n"
    monkeypatch.setattr(pipeline, "run_one", lambda *a, **kw: sys.exit(1))  # a stage's own SystemExit(1), no SIGTERM: as before
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--run-dir", str(tmp_path / "s"), "--set", f"corpus.paths=[{corpus}]"])
    assert e.value.code == 1 and capsys.readouterr().err == ""


def test_run_until_and_force_take_commands_or_names(capsys):
    p = build_parser()
    assert p.parse_args(["run"]).force is None
    assert p.parse_args(["run", "--force"]).force == [[]]  # every stage
    assert p.parse_args(["run", "--force", "cqg", "labels", "--force", "train"]).force == [["cqg", "labels"], ["train"]]
    assert p.parse_args(["run", "--until", "evaluate-run"]).until == "evaluate-run"
    assert p.parse_args(["run", "--until", "questions"]).until == "questions"
    for bad in (["--until", "evaluate"], ["--force", "nothing"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(["run", *bad])
        assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_log_level_takes_a_level_in_any_case(capsys):
    assert build_parser().parse_args(["--log-level", "debug", "status", "x"]).log_level == "DEBUG"
    with pytest.raises(SystemExit) as e:
        main(["--log-level", "foo", "status", "x"])
    assert e.value.code == 2
    assert "argument --log-level: invalid choice: 'FOO' (choose from" in capsys.readouterr().err


def test_an_import_error_in_a_command_module_surfaces(monkeypatch):
    monkeypatch.setattr(cli_module, "COMMAND_MODULES", (*cli_module.COMMAND_MODULES, "cqg_ray.no_such_module"))
    with pytest.raises(ModuleNotFoundError, match="cqg_ray.no_such_module"):
        build_parser()


def test_config_typo_is_a_clear_error(tmp_path, capsys):
    cfgf = tmp_path / "c.yaml"
    cfgf.write_text("cluster:\n  kk: 3\n")
    assert main(["prepare", "-c", str(cfgf)]) == 2
    assert "cluster.kk: unknown key" in capsys.readouterr().err


def test_set_run_dir_resumes_the_saved_config_as_run_dir_does(tmp_path):
    """--set run_dir=DIR names the run directory as --run-dir does: its saved config.yaml is the config (not the
    defaults, which would overwrite it and rerun its stages), --set keys win over it, and --config wins over both."""
    from cqg_ray.cli import resolve_config
    from cqg_ray.config import ConfigError, dump_config, load_config

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(None, [f"run_dir={run}", "cluster.k=7", "cluster.niter=5"])))
    p = build_parser()
    for argv in (["run", "--run-dir", str(run)], ["run", "--set", f"run_dir={run}"], ["cluster", "-s", "run_dir=elsewhere", "-s", f"run_dir={run}"]):
        cfg = resolve_config(p.parse_args([*argv, "--set", "cluster.niter=3"]))
        assert (cfg.run_dir, cfg.cluster.k, cfg.cluster.niter) == (str(run), 7, 3), argv
    cfg = resolve_config(p.parse_args(["run", "--config", "demo", "--set", f"run_dir={run}"]))
    assert (cfg.run_dir, cfg.cluster.k) == (str(run), load_config("demo").cluster.k)
    (run / "config.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"config.yaml is not UTF-8 text \(byte 0\); give --config$"):
        resolve_config(p.parse_args(["run", "--set", f"run_dir={run}"]))


def test_status_of_missing_run(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"error: no run directory at {tmp_path / 'nothing'}\n"
    # --run-dir as every other command takes it (it was "unrecognized arguments"); none, or two that differ: one line
    assert main(["status", "--run-dir", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"error: no run directory at {tmp_path / 'nothing'}\n"
    assert main(["status"]) == 2
    assert capsys.readouterr().err == "error: status: give the run directory (cqg-ray status DIR, or --run-dir DIR as the other commands take it)\n"
    assert main(["status", "a", "--run-dir", "b"]) == 2
    assert capsys.readouterr().err == "error: status: two run directories given (a and --run-dir b): give one\n"


def test_status_of_what_is_not_a_run_directory(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    for name, what in (("file.txt", "a file"), ("model", "a model folder (config.json)"), ("empty", "no config.yaml and no stage folder")):
        assert main(["status", str(tmp_path / name)]) == 2
        assert capsys.readouterr().err == f"error: {tmp_path / name} is not a cqg-ray run directory ({what})\n"
    (tmp_path / "model" / "evaluation").mkdir()  # `cqg-ray evaluate MODEL` writes it: still a model folder, not a run
    assert main(["status", str(tmp_path / "model")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'model'} is not a cqg-ray run directory (a model folder (config.json))\n"
    (tmp_path / "emb").mkdir()
    for name in ("_settings.json", "_lease.lock"):  # `cqg-ray embed` stopped early: its settings and its lease's lock
        (tmp_path / "emb" / name).write_text("")
    assert main(["status", str(tmp_path / "emb")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'emb'} is not a cqg-ray run directory (an output of cqg-ray embed (_settings.json))\n"
    (tmp_path / "empty" / "_lease.lock").write_text("")  # a run just started: its lease, nothing else yet
    assert main(["status", str(tmp_path / "empty")]) == 0
    assert "missing" in capsys.readouterr().out
    (tmp_path / "empty" / "_lease.lock").unlink()
    (tmp_path / "empty" / "config.yaml").write_text("run_dir: x\n")  # a run directory whose stages have not run
    assert main(["status", str(tmp_path / "empty")]) == 0
    assert "missing" in capsys.readouterr().out


@pytest.mark.slow
def test_kill_inside_encode_then_resume(tmp_path, corpus_file):
    run_dir = tmp_path / "run"
    sets = ["--set", f"corpus.paths=[{corpus_file}]", "--set", "corpus.limit=300", "--set", "corpus.rows_per_shard=300",
            "--set", "encode.unit_rows=30", "--set", "encode.num_actors=1", "--set", "ray.num_cpus=2", "--set", "cluster.k=10", "-r", str(run_dir)]
    # prepare and encode in one process (one Ray start), killed once encode has written 2 of its 10 units
    p = subprocess.Popen([sys.executable, "-m", "cqg_ray.cli", "run", "--until", "encode", *sets], env=ENV, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    enc = run_dir / "encode"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(enc.glob("emb-*.parquet"))) < 2:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    done_before = len(list(enc.glob("emb-*.parquet")))
    assert 2 <= done_before < 10
    assert (run_dir / "prepare" / "_manifest.json").exists() and not (enc / "_manifest.json").exists()
    st = cli("status", str(run_dir))  # the lease's holder is gone: the stage it named shows as interrupted, with its last progress line
    row = next(line for line in st.stdout.splitlines() if line.startswith("encode"))
    assert row.split()[:3] == ["encode", "interrupted", "-"] and re.search(r"encode: [\d,]+/300 text, .* ago\)$", row), row
    r = cli("encode", *sets, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    m = json.loads((enc / "_manifest.json").read_text())
    assert m["counts"]["documents"] == 300
    # Ray workers of the killed driver may finish the unit in hand: such a file is complete (written atomically)
    assert m["counts"]["units_resumed"] >= done_before
    assert m["counts"]["encoded_now"] == 300 - 30 * m["counts"]["units_resumed"]
    from cqg_ray.artifacts import load_embeddings
    from cqg_ray.rundir import RunDir

    ids, x = load_embeddings(RunDir(str(run_dir)))
    assert len(ids) == len(set(ids.tolist())) == 300
    # identical to encoding the same texts in one process
    from cqg_ray.artifacts import load_corpus
    from cqg_ray.encoder import load_encoder

    texts = load_corpus(RunDir(str(run_dir)), ["text"]).column("text").to_pylist()
    ref = load_encoder("bundled:all-MiniLM-L6-v2", backend="auto").encode(texts[:8])  # the stage's default backend
    assert abs(ref - x[:8]).max() < 1e-4
    st = cli("status", str(run_dir))
    assert "encode       done" in st.stdout


def test_ctrl_c_says_run_it_again_only_for_the_commands_that_resume(monkeypatch, capsys):
    """Ctrl-C: the commands that resume (run, the stages, embed, demo) say to run them again; evaluate, export, budget
    and the rest start over, so they only say they were interrupted."""
    import cqg_ray.evaluate.cli
    import cqg_ray.export
    from cqg_ray.cli import build_parser, main

    def interrupt(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cqg_ray.evaluate.cli, "cmd_evaluate", interrupt)
    monkeypatch.setattr(cqg_ray.export, "cmd_export", interrupt)
    assert main(["evaluate", "some-model"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert main(["export", "run", "out"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    parser = build_parser()
    resuming = {argv[0] for argv in (["run"], ["prepare"], ["label"], ["embed", "m", "c", "o"], ["demo"], ["evaluate", "m"], ["export", "r", "o"],
                                     ["budget", "m"], ["plan"], ["search", "m", "o", "q"], ["status", "r"], ["questions", "r"], ["explain", "m", "a", "b"])
                if getattr(parser.parse_args(argv), "resumes", False)}
    assert resuming == {"run", "prepare", "label", "embed", "demo"}


def test_config_prints_the_config_a_run_would_use_and_every_key(tmp_path, capsys):
    """No command printed the full config, and docs/pipeline.md names about 110 of its ~300 keys: `cqg-ray config`
    prints the YAML a run would use (it loads back as the same config), `--keys [SECTION]` every key with its value and
    meaning."""
    from cqg_ray.config import load_config

    assert main(["config", "--config", "demo", "--set", "cluster.k=8"]) == 0
    (tmp_path / "printed.yaml").write_text(capsys.readouterr().out)
    assert load_config(str(tmp_path / "printed.yaml")) == load_config("demo", ["cluster.k=8"])
    assert main(["config", "--keys", "cluster"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["cluster.k", "cluster.niter", "cluster.max_points_per_centroid", "cluster.spherical",
                                                   "cluster.n_neighbors", "cluster.seed"]
    assert lines[0].split(None, 2)[1:] == ["5000", "k: number of clusters (paper: 5,000)"]
    assert main(["config", "--keys"]) == 0 and len(capsys.readouterr().out.splitlines()) > 250
    assert main(["config", "--keys", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: config --keys nope: no such key or section (sections: run_dir, seed, ray,")
    # a run directory with no config.yaml (a mistyped one): the defaults, said to be them, where they looked like its config
    assert main(["config", "-r", str(tmp_path / "typo")]) == 0
    out, err = capsys.readouterr()
    assert err == f"config: {tmp_path / 'typo'} holds no config.yaml (no run there yet): the defaults, as a new run there would start\n"
    (tmp_path / "typo.yaml").write_text(out)
    assert load_config(str(tmp_path / "typo.yaml")) == load_config(None, [f"run_dir={tmp_path / 'typo'}"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text((tmp_path / "printed.yaml").read_text())
    assert main(["config", "-r", str(tmp_path / "run")]) == 0 and capsys.readouterr().err == ""


def test_the_stage_commands_help_says_what_they_read_write_and_exit_with(capsys):
    """The stage commands' help was one line: no folder written, no exit status; --log-level after the command was
    'unrecognized arguments'; --set did not say its values are YAML."""
    with pytest.raises(SystemExit):
        main(["encode", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "It reads the stage prepare of the run directory, and writes RUN/encode/ (its manifest last)" in text
    assert "Exit status: 0 done, 1 the stage failed, 2 a bad config or input, 3 the run directory is in use" in text
    assert "the value read as YAML), e.g. cluster.k=50 or 'corpus.paths=[a.jsonl, b.jsonl]'" in text
    assert build_parser().parse_args(["status", "x", "--log-level", "debug"]).log_level == "DEBUG"
    assert build_parser().parse_args(["--log-level", "error", "status", "x"]).log_level == "ERROR"  # before it, as before
    assert build_parser().parse_args(["status", "x"]).log_level is None


def test_embed_stopped_by_sigterm_unwinds_as_the_stage_commands_do(tmp_path, monkeypatch, capsys):
    """`kill` of `cqg-ray embed` printed Ray's stack dump ("*** SIGTERM received ... PC: @ ...") and exited 15; it now
    unwinds as Ctrl-C does (exit 143, a line saying to run it again, the handler put back)."""
    import cqg_ray.embed_cli

    def stopped(args):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the installed handler, called as the signal calls it
        raise AssertionError("SIGTERM did not unwind embed")

    monkeypatch.setattr(cqg_ray.embed_cli, "run_from_args", stopped)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        main(["embed", "cqg-minilm-ref", "corpus.jsonl", str(tmp_path / "out")])
    assert e.value.code == 143 and signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == "stopped: run the same command again to resume\n"
