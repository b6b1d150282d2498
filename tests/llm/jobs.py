"""Running the job scripts beside these tests (``tests/llm/*_job.py``) as separate processes, to kill and resume them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cqg_ray.llm.ledger import Ledger

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def job(script: str, run_dir: str) -> tuple[list[str], dict]:
    """The command line and environment that run ``tests/llm/<script> RUN_DIR`` with this checkout on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return [sys.executable, str(HERE / script), run_dir], env


def sigkill_after_finished(cmd: list[str], env: dict, ledger: Ledger, rows: int, timeout: float) -> None:
    """Start the job, wait until its ledger journal holds ``rows`` finished requests, then SIGKILL it wherever it is."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while len(ledger.journal_rows()) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "job too slow"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
