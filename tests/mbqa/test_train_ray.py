"""Ray Train: 2 data-parallel workers; a worker process SIGKILLed mid-run (restarted, or the run resumed later) and a
SIGKILLed driver, all resumed from the last checkpoint. The task trainer: Ray Train's one-worker heads exactly, and its
task SIGKILLed mid-run (retried, or the run resumed later)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa import train
from cqg_ray.mbqa.checkpoint import newest_whole_checkpoint
from cqg_ray.mbqa.train import LabelPairs, TrainResult, train_and_evaluate, train_heads

from .conftest import descendant_processes, make_problem

CFG = TrainConfig(epochs=4, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1, seed=0)
# the 1-worker run of `one_worker_run` (the 2-workers test's tolerances were measured at 40 epochs)
ONE_WORKER = TrainConfig(epochs=40, lr=1e-2, num_workers=1, cpus_per_worker=0.5, checkpoint_every=40, seed=0, trainer="ray")


def train_worker_pids(title: str = "ray::RayTrainWorker") -> set[int]:
    """PIDs of the Ray Train worker actors (or of the processes titled ``title``) now alive in this process's Ray:
    descendants of this process (the local Ray it started) whose process title starts with ``title``. Another Ray on
    the machine is not counted."""
    return {pid for pid, args in descendant_processes().items() if args.startswith(title)}


def train_in_thread(emb, dense, cfg, storage, name) -> tuple[threading.Thread, dict]:
    """train_heads started in a daemon thread; ``out["result"]`` is then its result or the exception it raised."""
    out: dict = {}

    def run():
        try:
            out["result"] = train_heads(emb, dense, cfg, storage, name)
        except Exception as e:
            out["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def train_killing_a_worker(emb, dense, cfg, storage, name, after_epoch: int = 2):
    """Run train_heads in a thread; once a checkpoint of `after_epoch` exists, SIGKILL one train worker process.

    Returns (result or the exception train_heads raised, the epoch of the latest checkpoint when the kill happened).
    """
    before = train_worker_pids()
    t, out = train_in_thread(emb, dense, cfg, storage, name)
    run_dir = os.path.join(storage, name)
    deadline = time.time() + 600  # a Train run starts ~7 processes: minutes on a busy 2-core machine (240 s was not enough)
    while time.time() < deadline and t.is_alive():
        if polled_checkpoint_epoch(Path(run_dir)) >= after_epoch:
            break
        time.sleep(0.05)
    assert t.is_alive() or polled_checkpoint_epoch(Path(run_dir)) >= 0, f"training ended without a checkpoint: {out.get('result')!r}"
    killed_at = settled_checkpoint_epoch(Path(run_dir))
    assert t.is_alive() and killed_at < cfg.epochs, "training ended before a worker could be killed"
    workers = sorted(train_worker_pids() - before)
    assert len(workers) == cfg.num_workers, workers
    os.kill(workers[-1], signal.SIGKILL)
    t.join(timeout=300)
    assert not t.is_alive()
    return out["result"], killed_at


def test_worker_killed_midway_restarts_from_last_checkpoint_and_a_killed_run_resumes(ray_local, problem, tmp_path):
    """SIGKILL of a real train worker process: with max_failures=1 Ray Train restarts the workers from the last
    checkpoint; with max_failures=0 the run fails and, started again, resumes. Both end with the same weights."""
    from ray.train import TrainingFailedError

    emb, dense = problem()
    cfg = CFG.model_copy(update={"epochs": 8, "max_failures": 1})
    r, killed_at = train_killing_a_worker(emb, dense, cfg, str(tmp_path), "restarted")
    assert isinstance(r, TrainResult), r
    assert r.epochs == 8 and r.metrics["epoch"] == 8
    assert 2 <= r.metrics["start_epoch"] <= 7  # restarted from a checkpoint, not from 0
    assert r.metrics["start_epoch"] >= killed_at

    cfg0 = cfg.model_copy(update={"max_failures": 0})
    failed, killed_at0 = train_killing_a_worker(emb, dense, cfg0, str(tmp_path), "killed", after_epoch=3)
    assert isinstance(failed, TrainingFailedError), failed
    resumed = train_heads(emb, dense, cfg0, str(tmp_path), "killed")  # same storage_path and name: resume
    assert resumed.epochs == 8 and resumed.metrics["start_epoch"] >= max(3, killed_at0)
    # training is deterministic (seeded init and per-epoch shuffles, restored Adam state): both runs end with the
    # same weights, whichever epoch they were interrupted at
    for k, v in r.heads.state_dict().items():
        torch.testing.assert_close(resumed.heads.state_dict()[k], v)


@contextlib.contextmanager
def kept_bars() -> Iterator[list]:
    """Inside the block ``train.EpochBar`` is one that keeps every bar it makes in the list yielded (the bars on:
    tests turn them off in conftest)."""
    bars: list[train.EpochBar] = []

    class KeptBar(train.EpochBar):
        def __init__(self, epochs, run=None):
            super().__init__(epochs, run)
            bars.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CQG_RAY_PROGRESS", "1")
        mp.setattr(train, "EpochBar", KeptBar)
        yield bars


@pytest.fixture(scope="module")
def one_worker_run(ray_local, tmp_path_factory):
    """`train_and_evaluate` with 1 worker on `make_problem()`, and the epoch counts its bar showed (each Ray Train run
    costs ~20 s of actor start-ups on 2 cores, so the held-out and epoch-bar tests read this run, and the 2-workers
    test compares against it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests' one_torch_thread (the held-out evaluation runs here, in the driver)
    try:
        emb, dense = make_problem()
        with kept_bars() as bars:
            result = train_and_evaluate(emb, dense, ONE_WORKER, str(tmp_path_factory.mktemp("one")), "one")
        return (*result, [b.shown for b in bars])
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_train_and_evaluate_holds_out_documents(one_worker_run, problem):
    emb, dense = problem()
    result, report, _ = one_worker_run
    pairs = LabelPairs.from_dense(dense)
    split = report["split"]
    assert split["train_pairs"] + split["heldout_pairs"] == len(pairs)
    assert split["heldout_docs"] == round(0.1 * len(np.unique(pairs.doc)))
    assert report["no"]["support"] + report["yes"]["support"] == split["heldout_pairs"]
    assert report["accuracy"] > 0.85
    assert result.epochs == ONE_WORKER.epochs


def test_the_task_trainer_gives_ray_trains_one_worker_heads_exactly(one_worker_run, problem, tmp_path):
    """The same data, seed and epochs through one Ray task instead of Ray Train's controller and worker: the same
    weights to the bit, the same metrics, and the bar follows its epochs from 0."""
    emb, dense = problem()
    ray_result, ray_report, _ = one_worker_run
    with kept_bars() as bars:
        task_result, task_report = train_and_evaluate(emb, dense, ONE_WORKER.model_copy(update={"trainer": "task"}), str(tmp_path), "one")
    for k, v in ray_result.heads.state_dict().items():
        assert torch.equal(task_result.heads.state_dict()[k], v), k
    assert {k: task_result.metrics[k] for k in ("epoch", "loss", "pairs", "steps", "pos_weight", "shard_pairs")} == \
        {k: ray_result.metrics[k] for k in ("epoch", "loss", "pairs", "steps", "pos_weight", "shard_pairs")}
    assert task_report == ray_report
    assert task_result.checkpoint_path == str(tmp_path / "one" / f"checkpoint_{ONE_WORKER.epochs:06d}")
    assert [b.shown for b in bars] == [list(range(ONE_WORKER.epochs + 1))]


def train_killing_the_task(emb, dense, cfg, storage, name, after_epoch: int = 2):
    """Run train_heads (the task trainer) in a thread; once the task's checkpoint of `after_epoch` exists, SIGKILL the
    process running it. Returns (result or the exception train_heads raised, the newest checkpoint's epoch then)."""
    t, out = train_in_thread(emb, dense, cfg, storage, name)
    folder = Path(storage) / name
    newest = lambda: max([int(p.name.split("_")[1]) for p in folder.glob("checkpoint_*")] or [-1])  # noqa: E731  whole ones
    deadline = time.time() + 300
    while time.time() < deadline and t.is_alive() and newest() < after_epoch:
        time.sleep(0.01)
    pids = train_worker_pids(f"ray::train {name}")  # then at once: a fast CPU runs an epoch in tens of milliseconds
    killed_at = newest()
    assert t.is_alive() and pids and after_epoch <= killed_at < cfg.epochs, f"not killed mid-run: {out.get('result')!r}, {pids}, {killed_at}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    t.join(timeout=300)
    assert not t.is_alive()
    return out["result"], killed_at


def test_the_task_trainer_killed_midway_is_retried_from_its_checkpoint_and_a_killed_run_resumes(ray_local, tmp_path):
    """SIGKILL of the process running the task trainer: with max_failures=1 Ray runs the task again, which resumes from
    the newest checkpoint; with max_failures=0 the run fails and, started again, resumes. Both end with the weights
    of a run never killed."""
    import ray.exceptions

    size = {"n_docs": 2000, "d": 64, "m": 200, "per_question": 600}  # ~75 steps an epoch: 30 epochs leave time to kill it mid-run
    emb, dense = make_problem(**size)
    cfg = TrainConfig(epochs=30, lr=1e-2, num_workers=1, cpus_per_worker=0.5, checkpoint_every=1, max_failures=1, seed=0)
    whole = train_heads(emb, dense, cfg, str(tmp_path), "whole")
    assert whole.epochs == 30 and whole.metrics["start_epoch"] == 0
    r, killed_at = train_killing_the_task(emb, dense, cfg, str(tmp_path), "retried")
    assert isinstance(r, TrainResult), r
    assert r.epochs == 30 and r.metrics["epoch"] == 30
    assert killed_at <= r.metrics["start_epoch"] < 30  # run again from a checkpoint, not from 0
    cfg0 = cfg.model_copy(update={"max_failures": 0})
    failed, killed_at0 = train_killing_the_task(emb, dense, cfg0, str(tmp_path), "killed")
    assert isinstance(failed, ray.exceptions.WorkerCrashedError), failed
    resumed = train_heads(emb, dense, cfg0, str(tmp_path), "killed")  # same storage_path and name: resume
    assert resumed.epochs == 30 and killed_at0 <= resumed.metrics["start_epoch"] < 30
    for k, v in whole.heads.state_dict().items():
        assert torch.equal(r.heads.state_dict()[k], v), k
        assert torch.equal(resumed.heads.state_dict()[k], v), k


@pytest.mark.slow
def test_the_epoch_bar_shows_where_a_resumed_run_starts(one_worker_run, driver_killed_and_resumed):
    """The driver's bar follows rank 0's epochs from 0; a run resumed from a checkpoint starts the bar at the
    checkpoint's epoch instead of leaving it at 0/N, and a finished run started again shows only its last epoch."""
    assert one_worker_run[2] == [list(range(ONE_WORKER.epochs + 1))]
    done, _, _, bars, _ = driver_killed_and_resumed
    assert bars == [[done, done + 1], [done + 1]]


DRIVER = textwrap.dedent("""
    import sys, ray
    sys.path.insert(0, {tests!r})
    from conftest import make_problem
    from cqg_ray.config import TrainConfig
    from cqg_ray.mbqa.train import train_heads
    from cqg_ray.pipeline import start_local_ray
    # its own Ray, killed with it; started again where a busy machine misses Ray's 30 s for the raylet to register
    start_local_ray(ray.init, address="local", num_cpus=2, include_dashboard=False)
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
    """The epoch of the run's latest checkpoint (the files must be complete)."""
    snap = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    name = snap["latest_checkpoint_result"]["checkpoint_dir_name"]
    return json.loads((run_dir / name / "state.json").read_text())["epoch"]


def polled_checkpoint_epoch(run_dir) -> int:
    """`latest_checkpoint_epoch`, or -1 while there is none yet or Ray is caught rewriting its snapshot (an empty file)."""
    try:
        return latest_checkpoint_epoch(run_dir)
    except (OSError, ValueError, KeyError):
        return -1


def settled_checkpoint_epoch(run_dir, seconds: float = 10.0) -> int:
    """`latest_checkpoint_epoch`, polled while Ray is caught rewriting its snapshot (an empty or partial file); after
    ``seconds`` one last read raises what it meets."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        epoch = polled_checkpoint_epoch(run_dir)
        if epoch >= 0:
            return epoch
        time.sleep(0.05)
    return latest_checkpoint_epoch(run_dir)


@pytest.fixture(scope="module")
def driver_killed_and_resumed(ray_local, tmp_path_factory):
    """A training driver (and the Ray it started) SIGKILLed once its second checkpoint exists, then in this process the
    run resumed for one more epoch and started once more: (the checkpoint's epoch, the resumed result, the result of
    the start after it, the epoch counts their bars showed, [the result of one more epoch after Train's snapshot was
    cut, the result of the finished run started again after it was cut again], each with the checkpoint folders in
    storage after it and those Train's snapshot names)."""
    size = {"n_docs": 2000, "d": 64, "m": 200, "per_question": 600}
    tmp_path = tmp_path_factory.mktemp("sigkill")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=os.path.dirname(__file__), problem=size, storage=str(tmp_path)))
    run_dir = tmp_path / "sigkill"
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            assert proc.poll() is None, f"the training driver ended before it could be killed:\n{log.read_text()[-3000:]}"
            if polled_checkpoint_epoch(run_dir) >= 2:
                break
            time.sleep(0.5)
    finally:
        kill_session(proc.pid)  # the driver and every Ray process it started (train actors run in their own groups)
        proc.wait()
    # the epoch it resumes from: the snapshot's, or where the kill cut the snapshot, the newest whole checkpoint's
    done = polled_checkpoint_epoch(run_dir)
    if done < 0 and (run_dir / train.SNAPSHOT).exists():
        done = newest_whole_checkpoint(str(run_dir))[1]
    assert done >= 2, "no second checkpoint within the time limit"
    emb, dense = make_problem(**size)
    cfg = TrainConfig(epochs=done + 1, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1)
    with kept_bars() as bars:
        r = train_heads(emb, dense, cfg, str(tmp_path), "sigkill")
        again = train_heads(emb, dense, cfg, str(tmp_path), "sigkill")
    # a kill while Train rewrote its snapshot, made certain: the snapshot cut, then one more epoch; cut again, the
    # finished run started once more
    cut = []
    for _ in range(2):
        (run_dir / train.SNAPSHOT).write_text("")
        result = train_heads(emb, dense, cfg.model_copy(update={"epochs": done + 2}), str(tmp_path), "sigkill")
        on_disk = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))
        named = sorted(c["checkpoint_dir_name"] for c in json.loads((run_dir / train.SNAPSHOT).read_text())["checkpoint_results"])
        cut.append((result, on_disk, named))
    return done, r, again, [b.shown for b in bars], cut


@pytest.mark.slow
def test_driver_killed_with_sigkill_resumes(driver_killed_and_resumed):
    """The driver process (and the Ray it started) is SIGKILLed mid-run; a new driver resumes from its checkpoint."""
    done, r, again, _, _ = driver_killed_and_resumed
    assert r.metrics["start_epoch"] == done and r.epochs == done + 1
    # started once more, the finished run has nothing left to do and returns its final heads
    assert again.epochs == done + 1
    for k, v in r.heads.state_dict().items():
        assert torch.equal(again.heads.state_dict()[k], v)


@pytest.mark.slow
def test_a_driver_killed_while_train_rewrote_its_snapshot_resumes(driver_killed_and_resumed):
    """Ray Train rewrites its checkpoint snapshot in place: a kill in that moment leaves it empty, and Train's own
    resume fails on it. The run resumes from its newest checkpoint, a finished one returns its final heads, and the
    checkpoints Train forgot with its snapshot are deleted once a run has finished."""
    done, r, _, _, ((more, more_disk, more_named), (finished, finished_disk, finished_named)) = driver_killed_and_resumed
    assert more.metrics["start_epoch"] == done + 1 and more.epochs == done + 2
    assert finished.metrics["start_epoch"] == done + 2 and finished.epochs == done + 2
    # the checkpoints Train no longer knows of (its snapshot was lost) are gone once each run has finished
    assert more_disk == more_named and finished_disk == finished_named and len(finished_named) >= 1
    for k, v in more.heads.state_dict().items():
        assert torch.equal(finished.heads.state_dict()[k], v)


def predictions(heads, emb):
    return torch.sigmoid(heads.forward_all(torch.tensor(emb))).detach().numpy()


def test_two_workers_give_the_heads_of_one_within_noise(one_worker_run, problem, tmp_path):
    """2 data-parallel workers reading their shards through Ray Data against 1 worker, same data, seed and epochs.

    The weights follow another path (DDP averages two shards' gradients: half the steps, each on twice the pairs;
    the shuffles are per rank), so they are compared by what they answer. Tolerance from two 1-worker runs that
    differ only in the seed (measured, AMD EPYC Zen 4): mean |P(yes) difference| 0.034 over all texts x questions, the
    same answer at tau 0.5 on 96.5%, held-out accuracy 0.926 vs 0.946; 2 workers against 1: 0.022, 98.8%, 0.936 vs
    0.926. The test asks for less than seed-to-seed noise plus a margin: < 0.05, >= 95%, accuracy within 0.03."""
    emb, dense = problem()
    one, one_report, _ = one_worker_run
    sigint = signal.getsignal(signal.SIGINT)
    two, two_report = train_and_evaluate(emb, dense, ONE_WORKER.model_copy(update={"num_workers": 2}), str(tmp_path), "two")
    # Train's fit() in the main thread installs a SIGINT handler holding its controller: ours is back after it, and the
    # controller actor with the Data actors it owns ends (they lived as long as the driver before, polling)
    assert signal.getsignal(signal.SIGINT) is sigint
    left = lambda: {pid for pid, args in descendant_processes().items() if args.startswith(("ray::TrainController", "ray::SplitCoordinator"))}  # noqa: E731
    deadline = time.time() + 60
    while left() and time.time() < deadline:
        time.sleep(0.5)
    assert not left()
    train_pairs = one_report["split"]["train_pairs"]
    assert one.metrics["pairs"] == two.metrics["pairs"] == train_pairs
    assert one.metrics["shard_pairs"] == train_pairs
    assert 0.3 * train_pairs < two.metrics["shard_pairs"] < 0.7 * train_pairs  # both workers trained on a share
    assert two.pos_weight == one.pos_weight
    p1, p2 = predictions(one.heads, emb), predictions(two.heads, emb)
    assert np.abs(p1 - p2).mean() < 0.05
    assert ((p1 > 0.5) == (p2 > 0.5)).mean() >= 0.95
    assert abs(one_report["accuracy"] - two_report["accuracy"]) <= 0.03


def fit_within(seconds, *args):
    """fit_heads in a thread; the result, or None when it did not finish in time (a hang)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("result", train.fit_heads(*args)), daemon=True)
    t.start()
    t.join(timeout=seconds)
    return out.get("result")


def test_two_workers_of_one_cpu_each_with_unequal_shards_end_running_the_same_steps(ray_local, problem, tmp_path):
    """One run, two hazards. Two workers asking 1 CPU each would hold both CPUs of the local Ray and the Data tasks that
    read their shards would wait forever: the workers are cut to 0.75 CPU each (train.data_cpus 0.5 kept for Data).
    Blocks of 1, 1 and all other texts: the split gives one worker a text and the other the rest, so their own step
    counts differ (1 against many): every worker runs the fullest shard's steps. The run ends."""
    import ray.data

    from cqg_ray.mbqa.loop import make_shards, steps_per_epoch
    from cqg_ray.mbqa.train_data import texts_table

    assert ray_local.cluster_resources()["CPU"] == 2
    emb, dense = problem()
    pairs = LabelPairs.from_dense(dense)
    docs = np.unique(pairs.doc)
    table = texts_table(docs.astype(str), emb[docs], np.searchsorted(docs, pairs.doc), pairs.question, pairs.answer)
    texts = ray.data.from_arrow([table.slice(0, 1), table.slice(1, 1), table.slice(2)])
    cfg = TrainConfig(epochs=2, lr=1e-2, num_workers=2, cpus_per_worker=1.0, checkpoint_every=2)
    r = fit_within(240, texts, emb.shape[1], pairs.n_questions, cfg, str(tmp_path), "unequal")
    assert r is not None, "2 workers x 1 CPU on 2 CPUs, with unequal shards, did not finish in 240 s"
    assert r.epochs == 2 and r.metrics["pairs"] == len(pairs)
    lone = pairs.doc == docs[1]  # the text of the second block: worker 1's whole shard; worker 0 has the rest
    own = [steps_per_epoch(make_shards(pairs.select(keep), 1), pairs.n_questions, cfg.pairs_per_head) for keep in (~lone, lone)]
    assert own[0] > own[1] == 1
    assert r.metrics["steps"] == own[0]  # the fullest shard's steps, on both workers
    assert r.metrics["shard_pairs"] == int((~lone).sum())
