"""bench/worker_reuse.py: the environment each side gets, the machine's busy CPU-seconds, and one driver run for real."""

import os
import sys

import pytest

from tests.scripts import ROOT, load_script

sys.path.insert(0, str(ROOT / "bench"))  # its `_common`, as `python bench/worker_reuse.py` finds it
reuse = load_script("bench/worker_reuse.py", "bench_worker_reuse")


def test_the_default_side_gets_rays_default_and_the_kept_side_the_tests_setting(monkeypatch):
    monkeypatch.setenv("RAY_num_workers_soft_limit", "9")
    default, kept = reuse.reuse_env(False), reuse.reuse_env(True)
    assert "RAY_num_workers_soft_limit" not in default and kept["RAY_num_workers_soft_limit"] == "4"
    assert default["PATH"] == kept["PATH"] == os.environ["PATH"]
    assert default["RAY_AUTH_MODE"] == kept["RAY_AUTH_MODE"] == "disabled"


def test_busy_cpu_seconds_count_this_processs_work():
    before = reuse.busy_cpu_seconds()
    t = os.times()
    while os.times().user - t.user < 0.3:  # spin 0.3 CPU-seconds
        pass
    assert reuse.busy_cpu_seconds() - before >= 0.25


@pytest.mark.ray
def test_one_driver_runs_its_jobs_and_reports_the_workers_it_started():
    r = reuse.run_driver(jobs=2, pause=0.0, kept=True)
    assert set(r) == {"seconds", "workers", "rss_mb", "busy_cpu_s"}
    assert r["workers"] >= 1 and 0 < r["seconds"] < 300 and r["rss_mb"] > 50 and r["busy_cpu_s"] > 0
