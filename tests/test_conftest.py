"""What tests/conftest.py sets for every process the tests start: thread pools that sleep when they have no work."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# CPU-seconds a process spends while it sleeps 0.3 s after an OpenBLAS matrix product, and while it sleeps 20 times
# 20 ms, each after a torch (OpenMP) product. Spinning, on 2 cores of the Zen 1 EPYC: ~0.13 s and ~0.17 s (OpenMP:
# ~6-9 ms after each product); with conftest's settings: 0.000 and 0.001.
IDLE_CPU = textwrap.dedent("""
    import json, resource, time
    import numpy as np, torch
    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    a, t = np.random.default_rng(0).random((600, 600)), torch.rand(600, 600)
    a @ a
    c = cpu(); time.sleep(0.3); openblas = cpu() - c
    t @ t; time.sleep(0.1)
    openmp = 0.0
    for _ in range(20):
        t @ t
        c = cpu(); time.sleep(0.02); openmp += cpu() - c
    print(json.dumps({"openblas": openblas, "openmp": openmp}))
""")


def test_idle_thread_pools_sleep_in_the_processes_the_tests_start():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: OpenBLAS and OpenMP start no second thread to spin")
    out = subprocess.run([sys.executable, "-c", IDLE_CPU], capture_output=True, text=True, timeout=120, check=True).stdout
    idle = json.loads(out.splitlines()[-1])
    assert (os.environ["OMP_WAIT_POLICY"], os.environ["OPENBLAS_THREAD_TIMEOUT"]) == ("PASSIVE", "4")
    assert idle["openblas"] < 0.03 and idle["openmp"] < 0.03, idle
