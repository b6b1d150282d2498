"""Kill the runner mid-run (SIGKILL and Ctrl-C), run it again: nothing finished is asked twice, only requests in flight are lost."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cqg_ray.llm.base import backend_identity
from cqg_ray.llm.ledger import Ledger, request_key
from cqg_ray.rundir import RunDir

from .fake_openai_server import FakeOpenAIServer
from .resume_job import CONCURRENCY, FLUSH_EVERY, job_requests, llm_config

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
N = 40


def start_job(run_dir: str, base_url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, str(HERE / "resume_job.py"), run_dir, base_url, str(N)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_requests(srv: FakeOpenAIServer, n: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.time()
    while len(srv.requests) < n:
        assert proc.poll() is None, f"job ended early: {proc.communicate()}"
        assert time.time() - t0 < timeout, "job too slow"
        time.sleep(0.01)


def prompts_by_key(base_url: str) -> dict[str, str]:
    llm = llm_config(base_url)
    return {request_key(backend_identity(llm), r, llm.logprobs): r.messages[0]["content"] for r in job_requests(N)}


def kill_and_resume(tmp_path, sig: int) -> tuple[int, int]:
    run_dir = str(tmp_path / "run")
    with FakeOpenAIServer(delay_s=0.05) as srv:
        key_to_prompt = prompts_by_key(srv.base_url)
        proc = start_job(run_dir, srv.base_url)
        wait_for_requests(srv, 18, proc)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        sent_first = [b["messages"][0]["content"] for b in srv.requests]
        ledger = Ledger(RunDir(run_dir), "labels")
        finished = ledger.load()
        assert len(finished) >= 8  # finished before the kill: all in the journal (flush_every is larger than N)
        if sig == signal.SIGKILL:
            assert ledger.shards() == [] and len(ledger.journal_rows()) == len(finished)
        assert set(key_to_prompt[k] for k in finished) <= set(sent_first)
        lost = len(set(sent_first)) - len(finished)

        n_first = len(srv.requests)
        proc = start_job(run_dir, srv.base_url)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        sent_second = [b["messages"][0]["content"] for b in srv.requests[n_first:]]

    finished_prompts = {key_to_prompt[k] for k in finished}
    assert not finished_prompts & set(sent_second), "a finished request was sent again"
    assert len(sent_second) == len(set(sent_second)) == N - len(finished)
    assert set(sent_first) | set(sent_second) == set(key_to_prompt.values())
    assert out.split()[:3] == ["DONE", str(N), str(len(finished))]
    assert len(Ledger(RunDir(run_dir), "labels").load()) == N
    return lost, len(finished)


def test_sigkill_loses_only_the_requests_in_flight_and_repeats_nothing(tmp_path):
    lost, _ = kill_and_resume(tmp_path, signal.SIGKILL)
    assert FLUSH_EVERY > N  # no shard was written before the kill
    assert lost <= 2 * CONCURRENCY  # requests in flight or queued in the client window


def test_ctrl_c_flushes_everything_that_finished(tmp_path):
    lost, _ = kill_and_resume(tmp_path, signal.SIGINT)
    assert lost <= 2 * CONCURRENCY  # only requests still in flight
