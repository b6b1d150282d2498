"""Ray Train: 2 data-parallel workers, a worker failure and a killed run, both resumed from the last checkpoint."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.train import LabelPairs, train_and_evaluate, train_heads

CFG = TrainConfig(epochs=4, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1, seed=0)


@pytest.fixture(scope="module")
def results():
    return {}


def test_worker_failure_restarts_from_last_checkpoint(ray_local, problem, tmp_path, results):
    emb, dense = problem()
    cfg = CFG.model_copy(update={"max_failures": 1})
    r = train_heads(emb, dense, cfg, str(tmp_path), "fail_once", fail_once_at_epoch=2)
    assert os.path.exists(tmp_path / "fail_once" / "_injected_failure")  # the failure did happen
    assert r.epochs == 4
    assert r.metrics["epoch"] == 4
    assert r.metrics["start_epoch"] == 1  # epoch 2 failed before its checkpoint: restarted after epoch 1, not from 0
    results["fail_once"] = r.heads


def test_killed_run_resumes_when_started_again(ray_local, problem, tmp_path, results):
    from ray.train import TrainingFailedError

    emb, dense = problem()
    cfg = CFG.model_copy(update={"max_failures": 0})
    with pytest.raises(TrainingFailedError):
        train_heads(emb, dense, cfg, str(tmp_path), "killed", fail_once_at_epoch=3)
    r = train_heads(emb, dense, cfg, str(tmp_path), "killed")  # same storage_path and name: resume
    assert r.epochs == 4
    assert r.metrics["start_epoch"] == 2
    # training is deterministic (seeded init and per-epoch shuffles, restored Adam state): both resumed runs
    # end with the same weights, whichever epoch they were interrupted at
    if "fail_once" in results:
        for k, v in results["fail_once"].state_dict().items():
            torch.testing.assert_close(r.heads.state_dict()[k], v)


@pytest.mark.slow
def test_train_and_evaluate_holds_out_documents(ray_local, problem, tmp_path):
    emb, dense = problem()
    cfg = CFG.model_copy(update={"num_workers": 1, "cpus_per_worker": 1.0, "epochs": 12, "checkpoint_every": 12})
    result, report = train_and_evaluate(emb, dense, cfg, str(tmp_path), "eval")
    pairs = LabelPairs.from_dense(dense)
    split = report["split"]
    assert split["train_pairs"] + split["heldout_pairs"] == len(pairs)
    assert split["heldout_docs"] == round(0.1 * len(np.unique(pairs.doc)))
    assert report["no"]["support"] + report["yes"]["support"] == split["heldout_pairs"]
    assert report["accuracy"] > 0.85
    assert result.epochs == 12


DRIVER = textwrap.dedent("""
    import sys, ray
    sys.path.insert(0, {tests!r})
    from conftest import make_problem
    from cqg_ray.config import TrainConfig
    from cqg_ray.mbqa.train import train_heads
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # its own Ray, killed with it
    emb, dense = make_problem(**{problem!r})
    cfg = TrainConfig(epochs=1000, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1)
    train_heads(emb, dense, cfg, {storage!r}, "sigkill")
""")


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session that `start_new_session` gave our driver subprocess."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        pid, session = map(int, line.split())
        if session == sid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def latest_checkpoint_epoch(run_dir) -> int:
    snap = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    name = snap["latest_checkpoint_result"]["checkpoint_dir_name"]
    return json.loads((run_dir / name / "state.json").read_text())["epoch"]


@pytest.mark.slow
def test_driver_killed_with_sigkill_resumes(ray_local, problem, tmp_path):
    """The driver process (and the Ray it started) is SIGKILLed mid-run; a new driver resumes from its checkpoint."""
    size = {"n_docs": 2000, "d": 64, "m": 200, "per_question": 600}
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=os.path.dirname(__file__), problem=size, storage=str(tmp_path)))
    run_dir = tmp_path / "sigkill"
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            assert proc.poll() is None, "the training driver ended before it could be killed"
            if (run_dir / "checkpoint_manager_snapshot.json").exists() and latest_checkpoint_epoch(run_dir) >= 2:
                break
            time.sleep(0.5)
    finally:
        kill_session(proc.pid)  # the driver and every Ray process it started (train actors run in their own groups)
        proc.wait()
    done = latest_checkpoint_epoch(run_dir)
    assert done >= 2, "no second checkpoint within the time limit"
    emb, dense = problem(**size)
    cfg = TrainConfig(epochs=done + 1, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1)
    r = train_heads(emb, dense, cfg, str(tmp_path), "sigkill")
    assert r.metrics["start_epoch"] == done and r.epochs == done + 1
    # started once more, the finished run has nothing left to do and returns its final heads
    again = train_heads(emb, dense, cfg, str(tmp_path), "sigkill")
    assert again.epochs == done + 1
    for k, v in r.heads.state_dict().items():
        assert torch.equal(again.heads.state_dict()[k], v)
