"""`cqg-ray serve` as a user runs it: a subprocess with its own Ray, answered over HTTP, stopped as `kill`, `docker stop`
and systemd stop it (SIGTERM); its wait ends on Ctrl-C (SIGINT) the same way."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from cqg_ray.config import ServeConfig

from tests.ports import free_port


def test_serve_cli_config(tmp_path):
    from cqg_ray.serve.cli import add_arguments, serve_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = serve_config(p.parse_args(["m"]))
    assert (cfg.host, cfg.port, cfg.num_replicas) == ("127.0.0.1", 8000, 1)
    y = tmp_path / "c.yaml"
    y.write_text("serve:\n  port: 9000\n  max_batch_size: 8\n")
    cfg = serve_config(p.parse_args(["m", "-c", str(y), "--replicas", "auto", "--set", "max_batch_size=64", "--port", "9100"]))
    assert (cfg.port, cfg.num_replicas, cfg.max_batch_size) == (9100, "auto", 64)
    cfg = serve_config(p.parse_args(["m", "--set", "serve.max_batch_size=48", "-s", "batch_wait_timeout_s=0.01"]))  # serve. optional
    assert (cfg.max_batch_size, cfg.batch_wait_timeout_s) == (48, 0.01)
    # Ray Serve refuses a trailing / (and wildcards) in serve.run, after Ray has started
    assert [serve_config(p.parse_args(["m", "--route-prefix", r])).route_prefix for r in ("/api/", "/api//", "/", "//")] == ["/api", "/api", "/", "/"]


def test_throughput_env_keeps_the_users_values():
    from cqg_ray.serve.cli import THROUGHPUT_ENV, use_throughput_env

    env = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1", "PATH": "/bin"}
    added = use_throughput_env(env)
    assert "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" not in added and env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "1"
    assert env == {**THROUGHPUT_ENV, "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1", "PATH": "/bin"}
    assert added == {k: v for k, v in THROUGHPUT_ENV.items() if k != "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"}


def test_serve_refuses_a_bad_model_folder(tmp_path):
    from cqg_ray.cli import main

    assert main(["serve", str(tmp_path / "missing")]) == 2


def test_serve_flags_are_checked_before_ray_starts(toy_model, capsys):
    """Each bad flag is one error line naming it (this quick-tier test would fail if Ray started)."""
    from cqg_ray.cli import main

    for flags, says in [(["--replicas", "abc"], "num_replicas"),
                        (["--replicas", "0"], "num_replicas.constrained-int: Input should be greater than or equal to 1"),
                        (["--port", "70000"], "port: Input should be less than or equal to 65535"),
                        (["--gpus-per-replica", "-1"], "num_gpus_per_replica: Input should be greater than or equal to 0"),
                        (["--route-prefix", "noslash"], "route_prefix: String should match pattern '^/'"),
                        (["--route-prefix", "/{name}"], "route_prefix: Ray Serve's prefixes take no { or } (wildcards) (got '/{name}')"),
                        (["--num-cpus", "0"], "num_cpus: Input should be greater than or equal to 1 (got 0)"),
                        (["--set", "port"], "--set port: give KEY=VALUE, a key of the serve section, e.g. --set max_batch_size=64"),
                        (["--set", "min_replicas=5"], "min_replicas (5) is above max_replicas (4)")]:
        assert main(["serve", toy_model, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, (flags, err)


def test_serve_refuses_a_missing_token_variable(toy_model, capsys, monkeypatch):
    from cqg_ray.cli import main

    assert main(["serve", toy_model, "--api-key-env", "CQG_RAY_SURELY_UNSET_VARIABLE"]) == 2
    assert "CQG_RAY_SURELY_UNSET_VARIABLE" in capsys.readouterr().err
    monkeypatch.setenv("CQG_RAY_BLANK_TOKEN", "  \t")  # the replicas would refuse it after Ray started: a traceback
    assert main(["serve", toy_model, "--api-key-env", "CQG_RAY_BLANK_TOKEN"]) == 2
    assert "CQG_RAY_BLANK_TOKEN: that environment variable is not set or holds only whitespace" in capsys.readouterr().err
    monkeypatch.setenv("CQG_RAY_ACCENT_TOKEN", "clé-secrète")  # no HTTP client can send it: every request would be a 401
    assert main(["serve", toy_model, "--api-key-env", "CQG_RAY_ACCENT_TOKEN"]) == 2
    assert ("error: --api-key-env CQG_RAY_ACCENT_TOKEN: that environment variable holds characters other than printable ASCII, "
            "which an Authorization header cannot carry") in capsys.readouterr().err


def test_serve_refuses_a_port_in_use_and_a_host_that_does_not_resolve(toy_model, capsys, monkeypatch):
    """A listener that set SO_REUSEPORT, as Ray Serve's proxy does, holds the port: a second server would share it and
    the kernel would split the clients between the two. Refused with one error line before Ray starts."""
    import cqg_ray.pipeline
    from cqg_ray.cli import main

    started = []
    monkeypatch.setattr(cqg_ray.pipeline, "init_ray", lambda *a, **k: started.append(a))  # another test may have left Ray up
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", toy_model, "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: cannot serve on 127.0.0.1:{port}: Address already in use (another server listens there, or the " \
                      "address is not this machine's); choose another --port\n"
    assert main(["serve", toy_model, "--host", "no-such-host.invalid"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot serve on --host no-such-host.invalid: the name does not resolve (") and "Traceback" not in err
    assert err.endswith("); choose another --host\n")
    assert started == []


WAITS = """
from cqg_ray.serve.cli import wait_for_stop
wait_for_stop("waiting")
print("stopped", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_serve_commands_wait_ends_on_ctrl_c_and_on_sigterm(sig):
    """What `cqg-ray serve` waits in once it serves: either signal, sent once the wait has said it is ready, ends the
    wait (the command then shuts Serve down and exits 0); the real command is stopped with SIGTERM below."""
    proc = subprocess.Popen([sys.executable, "-c", WAITS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (0, "stopped\n", "")


@pytest.mark.slow
def test_cqg_ray_serve_command(toy_model):
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    proc = subprocess.Popen([sys.executable, "-m", "cqg_ray.cli", "serve", toy_model, "--port", str(port), "--num-cpus", "1",
                             "--set", "num_cpus_per_replica=0.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not any(line.startswith("serving ") for line in lines):
            assert proc.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.5)
        assert any(line.startswith(f"serving {toy_model} at {url}/ui") for line in lines), "".join(lines)[-3000:]
        r = httpx.post(url + "/explain", json={"text_a": "a film with good actors", "text_b": "a movie I liked"}, timeout=60)
        assert r.status_code == 200 and r.json()["m"] == 32
        assert httpx.get(url + "/ui", timeout=30).status_code == 200
        # a second server on the same port is refused: Ray's proxy would share it with the first (SO_REUSEPORT)
        second = subprocess.run([sys.executable, "-m", "cqg_ray.cli", "serve", toy_model, "--port", str(port)], env=env,
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and f"cannot serve on 127.0.0.1:{port}: Address already in use" in second.stderr, second.stderr
        proc.send_signal(signal.SIGTERM)  # Ray's own handler would dump a stack trace and end the process before Serve stopped
        proc.wait(timeout=120)
        reader.join(timeout=10)
        assert proc.returncode == 0, "".join(lines)[-3000:]
        assert "stopping\n" in lines and not any("SIGTERM received" in line for line in lines), "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_printed_url_is_a_url_for_every_host():
    from cqg_ray.serve.cli import base_url

    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert base_url("0.0.0.0", 8000, "/api/") == "http://127.0.0.1:8000/api"
    assert base_url("::", 8000) == "http://127.0.0.1:8000"
    assert base_url("::1", 8001) == "http://[::1]:8001"
    assert base_url("fe80::1%eth0", 80, "/x") == "http://[fe80::1%25eth0]:80/x"
    assert base_url("localhost", 8000) == "http://localhost:8000"


def test_a_failed_deploy_is_told_by_the_replicas_exception(monkeypatch):
    from types import SimpleNamespace

    from ray import serve

    from cqg_ray.serve.cli import deploy_failure

    message = ("The deployment failed to start 3 times in a row.\nTraceback (most recent call last):\n  File \"app.py\", line 1\n"
               "cqg_ray.mbqa.embedder.ModelError: cannot load the encoder '/x' the model names\n\n")
    status = SimpleNamespace(applications={"cqg-mbqa": SimpleNamespace(deployments={"EmbedderServer": SimpleNamespace(message=message)})})
    monkeypatch.setattr(serve, "status", lambda: status)
    assert deploy_failure("cqg-mbqa") == "cqg_ray.mbqa.embedder.ModelError: cannot load the encoder '/x' the model names"
    assert deploy_failure("other") is None
    monkeypatch.setattr(serve, "status", lambda: (_ for _ in ()).throw(ConnectionError("gone")))
    assert deploy_failure("cqg-mbqa") is None


@pytest.mark.slow
def test_a_replica_that_cannot_start_is_one_error_line(toy_model, tmp_path):
    """A model whose encoder is missing loads without it in the CLI's check, and its replicas fail: one line that says
    why, exit 1, Serve shut down; it was a RuntimeError traceback that named no cause."""
    import json
    import shutil

    bad = tmp_path / "model"
    shutil.copytree(toy_model, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "encoder": str(tmp_path / "no-encoder")}))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    r = subprocess.run([sys.executable, "-m", "cqg_ray.cli", "serve", str(bad), "--port", str(free_port()), "--num-cpus", "1",
                        "--set", "num_cpus_per_replica=0.5"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"error: the application did not start: cqg_ray.mbqa.folder.ModelError: cannot load the encoder '{tmp_path / 'no-encoder'}'" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_replicas_that_a_local_ray_cannot_hold_are_refused(toy_model, capsys, monkeypatch):
    """Serve would wait for them without end and say nothing (cqg-ray serve --replicas 3 on 2 CPUs hung)."""
    import cqg_ray.pipeline
    from cqg_ray.cli import main
    from cqg_ray.serve.cli import local_shortfall

    cfg = ServeConfig()
    assert local_shortfall(cfg, 2, 0) is None and local_shortfall(cfg.model_copy(update={"num_replicas": 2}), 2, 0) is None
    assert local_shortfall(cfg.model_copy(update={"num_replicas": 3}), 2, 0) == (
        "3 replicas of 1 CPU each need 3 CPUs; this local Ray has 2: lower --replicas or num_cpus_per_replica "
        "(--set num_cpus_per_replica=0.5), or raise --num-cpus")
    assert local_shortfall(cfg.model_copy(update={"num_replicas": 4, "num_cpus_per_replica": 0.5}), 2, 0) is None
    assert local_shortfall(cfg.model_copy(update={"num_replicas": "auto", "min_replicas": 0}), 1, 0) is None  # one must fit
    assert local_shortfall(cfg.model_copy(update={"num_replicas": "auto", "min_replicas": 2}), 1, 0).startswith("2 replicas of 1 CPU")
    assert local_shortfall(cfg.model_copy(update={"num_gpus_per_replica": 1.0}), 4, 0) == (
        "1 replica of 1 GPU needs 1 GPU; this local Ray has 0: lower --replicas or --gpus-per-replica")
    monkeypatch.setattr(cqg_ray.pipeline, "init_ray", lambda *a, **k: pytest.fail("Ray started"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local Ray, which the check is for
    assert main(["serve", toy_model, "--replicas", "3", "--num-cpus", "2", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "error: 3 replicas of 1 CPU each need 3 CPUs; this local Ray has 2" in err and "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_replicas_start_shuts_serve_down(toy_model, capsys, monkeypatch, sig):
    """Ctrl-C or SIGTERM before the application is up: Serve shut down, exit 130, and not the CLI's 'run the same command
    again to resume' (there is nothing to resume)."""
    from ray import serve

    import cqg_ray.pipeline
    import cqg_ray.serve.cli as serve_cli
    from cqg_ray.cli import main

    stopped, before = [], signal.getsignal(signal.SIGTERM)  # Ray's own, where a test before this one started Ray
    monkeypatch.setattr(cqg_ray.pipeline, "init_ray", lambda *a, **k: None)
    # the installed handler, called as the signal calls it (a real signal to the test's own process took down its xdist
    # worker at times: CI at stops 89 and 91)
    monkeypatch.setattr(serve_cli, "start", lambda *a, **k: signal.getsignal(sig)(sig, None) or pytest.fail("not stopped"))
    monkeypatch.setattr(serve, "shutdown", lambda: stopped.append(True))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["serve", toy_model, "--port", str(free_port()), "--num-cpus", "1"]) == 130
    assert capsys.readouterr().err == "stopped before the application was up\n" and stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_server_open_to_other_machines_without_a_key_is_warned_of():
    from cqg_ray.serve.cli import open_to_others

    assert [open_to_others(ServeConfig(host=h)) for h in ("127.0.0.1", "127.0.1.1", "localhost", "::1")] == [None] * 4
    assert open_to_others(ServeConfig(host="0.0.0.0", api_key_env="CQG_RAY_API_KEY")) is None
    assert open_to_others(ServeConfig(host="0.0.0.0", port=9000)) == (
        "warning: serving on 0.0.0.0 without --api-key-env: anyone who can reach port 9000 can use the API (set a key, or bind 127.0.0.1)")
