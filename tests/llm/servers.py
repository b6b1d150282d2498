"""What the tests that start a real OpenAI-compatible server (llama.cpp's, vLLM's) share."""

import subprocess
import time

import httpx
import pytest


def start_server(name: str, cmd: list[str], port: int, log_path, wait_s: float, env: dict | None = None) -> subprocess.Popen:
    """``cmd`` started, its output in ``log_path`` (a file, not a pipe: a server logs a lot and would block on a full
    pipe), returned once it answers /v1/models on 127.0.0.1:port; the test fails, with the log's tail, where it exits
    or is not up within ``wait_s``."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}: {open(log_path).read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.time() - t0 > wait_s:
            stop_server(proc)
            pytest.fail(f"{name} did not start in {wait_s:.0f} s: {open(log_path).read()[-3000:]}")
        time.sleep(0.25)


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL where the server has not exited within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
