"""The pipeline runner's pure parts: which Ray to join, argument checks, the status against the saved config."""

import os
import socket
import time
from pathlib import Path

import pytest

from cqg_ray.config import ConfigError, PipelineConfig, dump_config, stage_hash
from cqg_ray.pipeline import ray_address, run_pipeline, run_status
from cqg_ray.rundir import RunDir, run_stage


def test_address_choice(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert ray_address(None, None) is None  # local Ray
    assert ray_address(None, "auto") == "auto"
    assert ray_address("ray://h:10001", "auto") == "ray://h:10001"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # what `ray job submit` sets for the entrypoint
    assert ray_address(None, None) == "10.0.0.1:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert ray_address(None, None) == "auto"


def test_rays_default_token_auth_line_is_not_shown_and_its_other_lines_are(monkeypatch):
    """Ray's own warnings, logged through its own logger: the one announcing the default token authentication (which
    suggests RAY_AUTH_MODE=disabled) is filtered out once init_ray has run quietly, the one for a cluster without it is
    kept."""
    import logging

    from ray._private.authentication import authentication_token_setup as setup

    import cqg_ray.pipeline
    from cqg_ray.config import RayConfig
    from cqg_ray.pipeline import quiet_default_auth

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    import ray

    monkeypatch.setattr(cqg_ray.pipeline, "start_local_ray", lambda init, **kwargs: None)  # Ray itself is not started
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a process where no earlier test started it
    cqg_ray.pipeline.init_ray(RayConfig())
    assert quiet_default_auth in logging.getLogger(setup.__name__).filters
    # Ray Data's warnings that the bars init_ray turns off are off: not shown
    assert logging.getLogger("ray.data._internal.progress").getEffectiveLevel() == logging.ERROR

    class Kept(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    logger, kept = logging.getLogger(setup.__name__), Kept()
    logger.addFilter(quiet_default_auth)  # as init_ray(quiet=True) adds it
    logger.addHandler(kept)
    try:
        setup._warn_token_auth_enabled()
        setup._warn_token_auth_disabled()
    finally:
        logger.removeFilter(quiet_default_auth)
        logger.removeHandler(kept)
    assert [line[:45] for line in kept.lines] == ["Token authentication is disabled for this Ray"]


def cluster_stand_in(cfg, ctx):
    """The cluster stage's own check on k (cqg_ray.cluster), before it writes; then a file as its output."""
    from cqg_ray.config import ConfigError

    if cfg.k > 400:
        raise ConfigError(f"cluster.k={cfg.k} is larger than the corpus (400 documents): lower cluster.k")
    ctx.run.write_json(f"{ctx.stage}/out.json", {"k": cfg.k})


def test_a_refused_rerun_keeps_the_finished_stage_and_the_runs_config(tmp_path, monkeypatch):
    """`cqg-ray cluster --set cluster.k=500` on a run whose cluster stage was done with k=8: it is refused, and the run
    directory stays as it was (the stage done, config.yaml with k=8), where the stage was shown missing and the refused
    k saved, so that the next run without --config failed the same way."""
    from dataclasses import replace

    import cqg_ray.stages
    from cqg_ray.config import ConfigError, load_config
    from cqg_ray.pipeline import run_one
    from cqg_ray.rundir import RunDir

    real = cqg_ray.stages.get("cluster")
    stand_in = replace(real, reads=(), function="tests.test_pipeline:cluster_stand_in")
    monkeypatch.setattr(cqg_ray.stages, "get", lambda name: stand_in if name == "cluster" else real)
    cfg = load_config("demo", [f"run_dir={tmp_path / 'run'}", "cluster.k=8"])
    run = RunDir(cfg.run_dir)
    done = run_one(cfg, "cluster")
    saved = run.read_bytes("config.yaml")
    with pytest.raises(ConfigError, match="cluster.k=500 is larger than the corpus"):
        run_one(load_config("demo", [f"run_dir={tmp_path / 'run'}", "cluster.k=500"]), "cluster")
    assert run.manifest("cluster") == done and run.read_bytes("config.yaml") == saved
    assert run_one(cfg, "cluster") == done  # done for its own config: skipped


def test_unknown_stage_names_fail_before_ray_starts(tmp_path):
    cfg = PipelineConfig(run_dir=str(tmp_path / "r"))
    for kwargs in ({"until": "evaluate"}, {"force": ["nope"]}, {"skip": ["questionz"]}):
        with pytest.raises(ValueError, match="unknown stage"):
            run_pipeline(cfg, **kwargs)
    assert not (tmp_path / "r").exists()


def test_status_judges_stages_against_the_saved_config(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    old = PipelineConfig(run_dir=run.root_uri)
    new = old.model_copy(update={"cluster": old.cluster.model_copy(update={"k": 7})})

    def write(ctx):
        ctx.counts["n"] = 1

    for stage in ("prepare", "encode", "cluster"):
        run_stage(run, stage, stage_hash(old, stage), write)
    run.write_bytes("config.yaml", dump_config(new).encode())
    states = {line.split()[0]: line.split()[1] for line in run_status(run).splitlines()[2:]}
    assert states == {"prepare": "done", "encode": "done", "cluster": "stale", "questions": "missing", "labels": "missing",
                      "model": "missing", "evaluation": "missing"}
    assert "(config changed)" in run_status(run).splitlines()[4]
    for unreadable in (b"cluster:\n  kk: 1\n", b"- a list\n", b"\xff\xfe garbage: [", b"key: [unclosed\n"):  # judged by the manifests alone
        run.write_bytes("config.yaml", unreadable)
        assert run_status(run).splitlines()[4].split()[:2] == ["cluster", "done"], unreadable
    os.remove(run.path("config.yaml"))
    os.mkdir(run.path("config.yaml"))  # a folder where the file belongs
    assert run_status(run).splitlines()[4].split()[:2] == ["cluster", "done"]


def test_a_runs_damaged_config_is_named_as_the_runs_file(tmp_path, capsys):
    from cqg_ray.cli import main

    run = tmp_path / "r"
    run.mkdir()
    for body, says in [(b"key: [unclosed\n", "is not valid YAML"), (b"- a list\n", ": the top level must be a mapping of sections"),
                       (b"\xff\xfe", "is not UTF-8 text (byte 0); give --config")]:
        (run / "config.yaml").write_bytes(body)
        assert main(["run", "-r", str(run), "--until", "prepare"]) == 2
        err = capsys.readouterr().err
        assert f"{run / 'config.yaml'}" in err and says in err and "/tmp/tmp" not in err and "Traceback" not in err, err


def test_release_memory_gives_the_freed_heap_back():
    """Memory freed in the middle of the heap (a live allocation above it) stays in RSS until release_memory."""
    import platform

    from cqg_ray.pipeline import release_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    chunks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MB of heap blocks (under glibc's mmap threshold)
    pin = bytearray(64 * 1024)  # above them: the heap's top cannot shrink past it
    held = rss_mb()
    del chunks
    freed = rss_mb()
    release_memory()
    after = rss_mb()
    assert held - freed < 50, (held, freed)  # free() alone gives little back
    assert freed - after > 150, (freed, after)  # malloc_trim gives the freed pages back
    assert len(pin) == 64 * 1024


def test_local_ray_env_caps_glibc_heaps_and_quiets_ray_train_unless_set():
    from cqg_ray.pipeline import local_ray_env

    env = {}
    local_ray_env(env)
    assert env == {"MALLOC_ARENA_MAX": "2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25"}
    mine = {"MALLOC_ARENA_MAX": "8", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "5"}
    local_ray_env(mine)
    assert mine == {"MALLOC_ARENA_MAX": "8", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "5"}  # the user's stay


def test_no_address_starts_a_new_local_ray_even_where_a_ray_start_cluster_runs(monkeypatch):
    """ray.init(address=None) joins the cluster whose address `ray start` (or a ray.cluster_utils head) left in
    /tmp/ray/ray_current_cluster: a `cqg-ray` run without an address would join another run's cluster, or fail on
    num_cpus. init_ray asks for address "local" then, and leaves RAY_ADDRESS to Ray where it is set."""
    import ray

    from cqg_ray.config import RayConfig
    from cqg_ray.pipeline import LOCAL_TRAIN_ENV, init_ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append((kw.get("address"), kw.get("num_cpus"))))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in {"MALLOC_ARENA_MAX": "2", **LOCAL_TRAIN_ENV}.items():  # what init_ray sets for a local Ray: restored after
        monkeypatch.setenv(key, value)
    init_ray(RayConfig(num_cpus=3))
    with socket.create_server(("127.0.0.1", 0)) as head:  # a head that accepts connections (init_ray checks first)
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{head.getsockname()[1]}")
        init_ray(RayConfig(num_cpus=3))
    init_ray(RayConfig(address="auto"))
    assert calls == [("local", 3), (None, 3), ("auto", None)]


def test_init_ray_keeps_a_commands_own_sigterm_handler_over_rays(monkeypatch):
    """Ray's ray.init puts its own SIGTERM handler in (a stack dump, then the process aborts: exit 134): where the
    command set one (cli.unwinds_on_sigterm: exit 143, ledgers flushed, lease given back) init_ray puts it back; where
    none was set, Ray's stays."""
    import signal

    import ray

    from cqg_ray.config import RayConfig
    from cqg_ray.pipeline import init_ray

    def rays(signum, frame):
        pass

    def ours(signum, frame):
        pass

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: signal.signal(signal.SIGTERM, rays))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        init_ray(RayConfig(num_cpus=1))
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        init_ray(RayConfig(num_cpus=1))
        assert signal.getsignal(signal.SIGTERM) is rays
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_while_ray_starts_goes_to_the_commands_own_handler(monkeypatch):
    """ray.init puts in a SIGTERM handler of its own first (``sys.exit(15)``): a SIGTERM in the seconds Ray takes to
    start ended `cqg-ray run` with exit 15 and not a word. It now goes to the command's own handler (exit 143, a line
    saying to run it again), which is put back."""
    import signal

    import ray

    from cqg_ray.config import RayConfig
    from cqg_ray.pipeline import init_ray

    def rays(signum, frame):
        raise SystemExit(signum)  # ray.init's: sys.exit(signum)

    def starting(**kw):
        signal.signal(signal.SIGTERM, rays)
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the signal, as it lands while Ray starts

    seen = []

    def ours(signum, frame):
        seen.append(signum)
        raise SystemExit(143)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", starting)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = signal.signal(signal.SIGTERM, ours)
    try:
        with pytest.raises(SystemExit) as e:
            init_ray(RayConfig(num_cpus=1))
        assert e.value.code == 143 and seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_address_where_no_head_answers_is_said_in_seconds(tmp_path, monkeypatch, capsys):
    """ray.init retries an address where nothing listens for minutes (over 6 here), printing Ray's warnings; init_ray
    says so once nothing has accepted a connection for JOIN_WAIT_S, and `cqg-ray run` exits 2 with that line."""
    import ray

    import cqg_ray.pipeline
    from cqg_ray.cli import main
    from cqg_ray.config import RayConfig
    from cqg_ray.pipeline import head_unreachable, init_ray

    with socket.create_server(("127.0.0.1", 0)) as head:
        port = head.getsockname()[1]
        assert [head_unreachable(a, wait_s=0.2) for a in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}")] == [None, None]
    closed = f"127.0.0.1:{port}"  # nothing listens there now
    t0 = time.monotonic()
    assert head_unreachable(closed, wait_s=0.5) == (f"no Ray head answers at 127.0.0.1:{port} (Connection refused, for 0.5 s): "
                                                    "check the address given by --address, RAY_ADDRESS or ray.address (`ray status` on the head prints it)")
    assert 0.5 <= time.monotonic() - t0 < 3
    assert head_unreachable(f"ray://[::1]:{port}", wait_s=0).startswith(f"no Ray head answers at ::1:{port} (")
    assert [head_unreachable(a, wait_s=0) for a in ("auto", "local", "http://127.0.0.1:1", "no-port", "h:notaport")] == [None] * 5

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("ray.init was called"))
    monkeypatch.setattr(cqg_ray.pipeline, "JOIN_WAIT_S", 0.3)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=f"^no Ray head answers at 127.0.0.1:{port}"):
        init_ray(RayConfig(address=closed))
    monkeypatch.setenv("RAY_ADDRESS", closed)
    with pytest.raises(ConfigError, match=f"^no Ray head answers at 127.0.0.1:{port}"):
        init_ray(RayConfig())
    monkeypatch.delenv("RAY_ADDRESS")
    corpus = Path(__file__).parent / "fixtures" / "corpus_400.jsonl"  # prepare's corpus is listed before the lease
    assert main(["run", "--address", closed, "--set", f"run_dir={tmp_path / 'run'}", "--set", f"corpus.paths=[{corpus}]"]) == 2
    err = capsys.readouterr().err
    assert f"error: could not start or join Ray (address {closed}): ConfigError: no Ray head answers at 127.0.0.1:{port}" in err


@pytest.mark.ray
@pytest.mark.parametrize("address", [None, "local"])  # RAY_ADDRESS=local (what bench/scale.py sets) also starts one
def test_a_local_ray_started_by_init_ray_gives_its_workers_two_heaps(tmp_path, address):
    """...and its workers (and the driver, whose environment Ray Train's runs read) the local Ray Train settings."""
    import os
    import subprocess
    import sys

    from cqg_ray.pipeline import LOCAL_TRAIN_ENV

    keys = ["MALLOC_ARENA_MAX", *LOCAL_TRAIN_ENV]
    script = ("import os, ray\nfrom cqg_ray.config import RayConfig\nfrom cqg_ray.pipeline import init_ray\n"
              f"init_ray(RayConfig(num_cpus=1, address={address!r}))\n"
              f"print(ray.get(ray.remote(lambda: [os.environ.get(k) for k in {keys!r}]).remote()), [os.environ.get(k) for k in {keys!r}])\n")
    env = {k: v for k, v in os.environ.items() if k not in (*keys, "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"{['2', '0', '0.25']} {['2', '0', '0.25']}"


def test_a_local_ray_start_that_times_out_is_started_again_and_other_errors_are_raised():
    from cqg_ray.pipeline import start_local_ray

    calls = []

    def init(fail_with):
        def f(**kw):
            calls.append(kw)
            if fail_with and len(calls) <= fail_with[1]:
                raise fail_with[0]
        return f

    timeout = Exception("The current node timed out during startup. This could happen because ...")
    start_local_ray(init((timeout, 2)), address="local", num_cpus=2)
    assert calls == [{"address": "local", "num_cpus": 2}] * 3
    calls.clear()
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(init((timeout, 3)), address="local")
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(ValueError, match="num_cpus"):
        start_local_ray(init((ValueError("num_cpus"), 1)), address="local")
    assert len(calls) == 1


def test_a_local_ray_start_stopped_by_sigterm_stops_what_it_started():
    """SIGTERM in the seconds Ray starts (ray.init's handler: SystemExit) left the raylet's agents running for good
    where they were still starting; the processes the start began are stopped before the exit goes on."""
    import subprocess
    import sys

    import psutil

    from cqg_ray.pipeline import start_local_ray

    started = []

    def init(**kw):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        raise SystemExit(15)

    try:
        with pytest.raises(SystemExit):
            start_local_ray(init, address="local")
        assert not psutil.pid_exists(started[0].pid)  # killed and reaped
    finally:
        started[0].kill()


@pytest.mark.ray
def test_init_ray_rides_out_a_ray_start_timeout_and_stops_what_it_left(tmp_path):
    """The first start "times out" after starting a process (as Ray's GCS or raylet would be left); init_ray stops it
    and starts a real local Ray that runs a task."""
    import os
    import subprocess
    import sys

    script = (
        "import subprocess, sys, ray\n"
        "from cqg_ray.config import RayConfig\nfrom cqg_ray.pipeline import init_ray\n"
        "real, left = ray.init, []\n"
        "def first_times_out(**kw):\n"
        "    if left:\n"
        "        return real(**kw)\n"
        "    left.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']))\n"
        "    raise Exception('The current node timed out during startup. This could happen because ...')\n"
        "ray.init = first_times_out\n"
        "init_ray(RayConfig(num_cpus=1))\n"
        "print(left[0].poll() is not None, ray.get(ray.remote(lambda: 41 + 1).remote()))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True 42"
    assert "starting it again (2 of 3)" in out.stderr
