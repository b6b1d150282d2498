"""What the tests that start a real OpenAI-compatible server (llama.cpp's, vLLM's) share."""

import subprocess


def stop_server(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL where the server has not exited within ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
