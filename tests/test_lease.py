"""The run directory's lease: one writer at a time, stale leases taken over, --break-lease, and every writing command
refused fast (before Ray, before any LLM call) while another run holds the directory."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import fsspec
import pytest

from cqg_ray import lease as L
from tests.conftest import ROOT

SHIPPED = ROOT / "models" / "cqg-minilm-ref"


def _snapshot(path) -> dict:
    """Every file under path with its size and mtime (what "nothing changed" compares)."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            out[os.path.relpath(p, path)] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_second_writer_is_refused_and_named(tmp_path):
    first = L.acquire(str(tmp_path), "cqg-ray run")
    with pytest.raises(L.LeaseHeld) as e:
        L.acquire(str(tmp_path), "cqg-ray demo")
    msg = str(e.value)
    assert "in use by another run" in msg
    assert "`cqg-ray run`" in msg and f"pid {os.getpid()}" in msg and socket.gethostname() in msg
    first.release()
    assert not (tmp_path / L.LEASE).exists()
    second = L.acquire(str(tmp_path), "cqg-ray demo")  # free again
    assert json.loads((tmp_path / L.LEASE).read_text())["holder"]["command"] == "cqg-ray demo"
    second.release()


def test_lease_file_names_its_holder_and_beats(tmp_path):
    with L.take_lease(str(tmp_path), "cqg-ray prepare") as lease:
        rec = json.loads((tmp_path / L.LEASE).read_text())
        assert set(rec["holder"]) == {"host", "boot_id", "pid", "pid_start", "command", "started_at"}
        assert rec["holder"]["pid"] == os.getpid() and rec["holder"]["command"] == "cqg-ray prepare"
        assert rec["token"] == lease.token and rec["ttl_s"] == L.DEFAULT_TTL_S
        before = rec["heartbeat_at"]
        time.sleep(0.01)
        assert lease.heartbeat() is True
        assert json.loads((tmp_path / L.LEASE).read_text())["heartbeat_at"] > before
    assert not (tmp_path / L.LEASE).exists()


def _write_lease(path, **holder) -> dict:
    rec = {"holder": {"host": "elsewhere", "boot_id": "x", "pid": 1, "pid_start": "", "command": "cqg-ray run",
                      "started_at": "2026-11-25T00:00:00Z", **holder},
           "token": "old", "heartbeat_at": time.time(), "ttl_s": 60.0}
    (path / L.LEASE).write_text(json.dumps(rec))
    return rec


def test_a_lease_without_heartbeat_goes_stale_and_is_taken_over(tmp_path, caplog):
    rec = _write_lease(tmp_path)
    with pytest.raises(L.LeaseHeld):  # another machine, fresh heartbeat: live
        L.acquire(str(tmp_path), "cqg-ray run")
    rec["heartbeat_at"] = time.time() - 61
    (tmp_path / L.LEASE).write_text(json.dumps(rec))
    assert L.stale_reason(rec).startswith("no heartbeat for 61 s")
    with caplog.at_level("INFO", logger="cqg_ray"):
        lease = L.acquire(str(tmp_path), "cqg-ray run")
    assert "taking over the stale lease" in caplog.text and "no heartbeat" in caplog.text
    assert json.loads((tmp_path / L.LEASE).read_text())["token"] == lease.token
    lease.release()


def test_a_damaged_lease_file_is_stale_and_taken_over(tmp_path):
    """Bytes that are not UTF-8, a holder that is not an object, a heartbeat or timeout that is not a number: read as
    a lease with no heartbeat (stale); a heartbeat far in the future would never go stale and is stale too."""
    rec = _write_lease(tmp_path)
    for body in (b"\xff\xfe{", json.dumps({"holder": "me"}).encode(), json.dumps({**rec, "heartbeat_at": "yesterday"}).encode(),
                 json.dumps({**rec, "ttl_s": "long"}).encode(), json.dumps([rec]).encode()):
        (tmp_path / L.LEASE).write_bytes(body)
        lease = L.acquire(str(tmp_path), "cqg-ray run")
        lease.release()
    assert L.stale_reason({}) == L.stale_reason({"holder": {}}) == "its lease file holds no heartbeat (damaged, or not written by cqg-ray)"
    assert L.describe({}) == "`?` (pid ? on ?, started ?, no heartbeat)"
    future = {**rec, "heartbeat_at": time.time() + 3600}
    assert L.stale_reason(future, ttl=60).startswith("its heartbeat is 3600 s in the future")
    assert L.stale_reason({**rec, "heartbeat_at": time.time() + 5}, ttl=60) is None  # a few seconds of clock skew: live


def test_a_killed_holder_on_this_machine_is_stale_at_once(tmp_path):
    code = f"import time; from cqg_ray import lease as L; L.acquire({str(tmp_path)!r}, 'cqg-ray run'); print('held', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(L.LeaseHeld):
        L.acquire(str(tmp_path), "cqg-ray run")
    p.kill()  # kill -9: the lease stays on disk with a fresh heartbeat
    time.sleep(0.3)  # not reaped yet: a zombie counts as gone
    rec = json.loads((tmp_path / L.LEASE).read_text())
    assert L.stale_reason(rec) == "its process is gone"
    p.wait()
    assert rec["holder"]["pid"] == p.pid and L.stale_reason(rec) == "its process is gone"
    t0 = time.time()
    lease = L.acquire(str(tmp_path), "cqg-ray run")  # no waiting for the heartbeat timeout
    assert time.time() - t0 < 2
    lease.release()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_break_lease_takes_a_live_one_and_the_holder_stops(tmp_path, sigint):
    """The holder stops at its next heartbeat, also when it was started with SIGINT ignored (a shell script's `cmd &`)."""
    code = textwrap.dedent(f"""
        import signal, time
        signal.signal(signal.SIGINT, signal.{'SIG_IGN' if sigint == 'ignored' else 'default_int_handler'})
        from cqg_ray import lease as L
        try:
            with L.take_lease({str(tmp_path)!r}, 'cqg-ray run') as lease:
                lease._stop.set(); lease._thread.join(); lease.start_heartbeat(every=0.2)
                print('held', flush=True)
                time.sleep(30)
            print('not stopped', flush=True)
        except KeyboardInterrupt:
            print('stopped:', lease.lost, flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(L.LeaseHeld):
        L.acquire(str(tmp_path), "cqg-ray demo")
    mine = L.acquire(str(tmp_path), "cqg-ray demo", break_lease=True)
    out, err = p.communicate(timeout=20)
    assert out.startswith("stopped: `cqg-ray demo`")
    assert "lease on" in err and "lost" in err
    assert json.loads((tmp_path / L.LEASE).read_text())["token"] == mine.token  # the old holder did not delete ours
    mine.release()


def test_a_lost_lease_stops_the_run_saying_who_took_it_and_what_to_do(tmp_path):
    root = str(tmp_path)
    took = "`cqg-ray demo` (pid 7 on vm, started 2026-11-25T00:00:00Z, last heartbeat 0 s ago)"
    then = (f"so it wrote nothing more. Two runs writing one directory can corrupt it: let the other run finish or stop it "
            f"(`cqg-ray status {root}` shows it), then run this command again to resume")
    for lost, what in [(took, f"{took} took it with --break-lease"), (L.DELETED, "its lease file was deleted by someone else")]:
        with pytest.raises(L.LeaseLost) as e:
            with L.take_lease(root, "cqg-ray run") as lease:
                lease.lost = lost  # what the heartbeat sets before the SIGINT it sends itself
                raise KeyboardInterrupt
        assert str(e.value) == f"this run stopped: it no longer holds the run directory {root} ({what}), {then}"
        assert isinstance(e.value, KeyboardInterrupt) and e.value.lost == lost  # what handles an interruption still runs
    with pytest.raises(KeyboardInterrupt) as e:  # Ctrl-C while the lease is ours: an interruption as before
        with L.take_lease(root, "cqg-ray run") as lease:
            assert L.lease_lost(root) is None
            raise KeyboardInterrupt
    assert type(e.value) is KeyboardInterrupt and L.lease_lost(root) is None


@pytest.mark.parametrize("command", ["prepare", "run"])
def test_a_run_displaced_by_break_lease_exits_3_saying_so(tmp_path, command):
    """The displaced `cqg-ray run` or stage command says who took its directory and what to do (exit 3), not "run the
    same command again to resume" at once, which would take the directory back from the run that now writes it."""
    run = tmp_path / "run"
    corpus = ROOT / "tests" / "fixtures" / "corpus_400.jsonl"  # prepare's corpus is listed before the lease
    code = textwrap.dedent(f"""
        import sys, time
        import ray
        import cqg_ray.pipeline as pipeline
        from cqg_ray.cli import main

        def working(*a, **kw):
            print('working', flush=True)
            time.sleep(30)

        ray.cluster_resources, ray.nodes = dict, list  # no Ray started: the stages stand in
        pipeline.init_ray, pipeline.run_one, pipeline.run_pipeline = (lambda cfg: None), working, working
        sys.exit(main([{command!r}, '--run-dir', {str(run)!r}, '--set', 'corpus.paths=[{corpus}]']))
    """)
    env = {**os.environ, "CQG_RAY_LEASE_TTL_S": "1.2"}  # a heartbeat every 0.2 s
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    while p.stdout.readline().strip() != "working":
        assert p.poll() is None, p.stderr.read()
    mine = L.acquire(str(run), "cqg-ray demo", break_lease=True)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: this run stopped: it no longer holds the run directory {run} (`cqg-ray demo` (pid {os.getpid()} on ")
    assert last.endswith(f"took it with --break-lease), so it wrote nothing more. Two runs writing one directory can corrupt it: let the "
                         f"other run finish or stop it (`cqg-ray status {run}` shows it), then run this command again to resume")
    assert "same command again" not in err and "Traceback" not in err, err
    assert json.loads((run / L.LEASE).read_text())["token"] == mine.token
    mine.release()


def test_sigint_is_handled_while_a_lease_is_held_and_ignored_again_after(tmp_path):
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with L.take_lease(str(tmp_path), "cqg-ray run"):
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    with L.take_lease(str(tmp_path), "cqg-ray run"):  # a handler already there is left alone
        assert signal.getsignal(signal.SIGINT) is before


def test_two_writers_started_together_exactly_one_proceeds(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from cqg_ray import lease as L
        while time.time() < float(sys.argv[1]):
            pass
        try:
            L.acquire({str(tmp_path)!r}, 'writer')
            print('got', flush=True)
            time.sleep(3)
        except L.LeaseHeld:
            print('refused', flush=True)
    """)
    for _ in range(3):
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", code, str(start)], stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(4)]
        outs = sorted(p.communicate(timeout=30)[0].strip() for p in procs)
        assert outs == ["got", "refused", "refused", "refused"]


def test_object_store_conditional_create_one_winner():
    fs = fsspec.filesystem("memory")
    fs.rm("/leasetest", recursive=True) if fs.exists("/leasetest") else None
    first = L.acquire("memory://leasetest/run", "cqg-ray run")
    assert first.store.kind == "fsspec"
    with pytest.raises(L.LeaseHeld):
        L.acquire("memory://leasetest/run", "cqg-ray demo")
    # a stale one (no heartbeat for long) is taken over; the conditional create decides
    rec = json.loads(fs.cat("/leasetest/run/" + L.LEASE))
    rec["heartbeat_at"] -= 3600
    fs.pipe("/leasetest/run/" + L.LEASE, json.dumps(rec).encode())
    second = L.acquire("memory://leasetest/run", "cqg-ray demo")
    assert json.loads(fs.cat("/leasetest/run/" + L.LEASE))["token"] == second.token
    assert first.heartbeat() is False and "cqg-ray demo" in first.lost
    second.release()
    assert not fs.exists("/leasetest/run/" + L.LEASE)


def _cli(*args, timeout=30):
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "cqg_ray.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    return p, time.time() - t0


@pytest.mark.parametrize("argv", [
    ["run", "--config", "demo", "--run-dir", "{run}"],
    ["prepare", "--config", "demo", "--run-dir", "{run}"],
    ["cqg", "--config", "demo", "--run-dir", "{run}", "--force"],
    ["label", "--config", "demo", "--run-dir", "{run}"],
    ["demo", "--set", "run_dir={run}"],
    ["embed", str(SHIPPED), str(ROOT / "tests" / "fixtures" / "corpus_400.jsonl"), "{run}"],
])
def test_every_writing_command_is_refused_fast_and_changes_nothing(tmp_path, argv):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run_dir: x\n")
    held = L.acquire(str(run), "cqg-ray run (the first one)")
    before = _snapshot(run)
    p, seconds = _cli(*[a.format(run=run) for a in argv])
    assert p.returncode == 3, p.stderr
    assert seconds < 10
    assert f"the run directory {run} is in use by another run: `cqg-ray run (the first one)` (pid {os.getpid()}" in p.stderr
    assert "--break-lease" in p.stderr
    assert _snapshot(run) == before  # no config written, no stage folder, no ledger
    held.release()


def test_readers_take_no_lease(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    held = L.acquire(str(run), "cqg-ray run")
    p, _ = _cli("status", str(run))
    assert p.returncode == 0, p.stderr
    assert "lease: held by `cqg-ray run`" in p.stdout
    held.release()
