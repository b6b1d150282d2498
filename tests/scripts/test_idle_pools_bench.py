"""bench/idle_pools.py: the environment each side gets, and one encoder process run for real."""

import os
import sys

from tests.scripts import ROOT, load_script

sys.path.insert(0, str(ROOT / "bench"))  # its `_common`, as `python bench/idle_pools.py` finds it
pools = load_script("bench/idle_pools.py", "bench_idle_pools")


def test_the_spinning_side_gets_the_libraries_defaults_and_the_passive_side_the_tests_settings(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "28")
    spinning, passive = pools.pool_env(False), pools.pool_env(True)
    assert "OMP_WAIT_POLICY" not in spinning and "OPENBLAS_THREAD_TIMEOUT" not in spinning
    assert (passive["OMP_WAIT_POLICY"], passive["OPENBLAS_THREAD_TIMEOUT"]) == ("PASSIVE", "4")
    assert spinning["PATH"] == passive["PATH"] == os.environ["PATH"]


def test_one_encoder_process_reports_its_seconds():
    [seconds] = pools.encode_side_by_side(["A dog runs in the park.", "The bank raised rates."] * 40, 1, passive=True)
    assert 0 < seconds < 60
