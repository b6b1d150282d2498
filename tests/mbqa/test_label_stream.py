"""The streaming label stage on a real local Ray: the same labels as in-process, large ledger shards, and a kill -9
of the whole job (driver and workers) that a rerun finishes without sending anything finished again."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc

from cqg_ray.config import stage_hash
from cqg_ray.rundir import RunDir, run_stage
from tests.conftest import copy_clustered, small_config

ROOT = Path(__file__).parents[2]


def questions_run(clustered_run, corpus_file, dest, label=None, **extra):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, dest)
    cfg = small_config(d, corpus_file, max_clusters=4, extra={"llm": {"flush_every": 50_000, **extra}, "label": label or {}})
    run_stage(RunDir(str(d)), "questions", stage_hash(cfg, "questions"),
              lambda ctx: run_cqg(cfg, ctx, backend=FakeBackend(cfg.llm, reply=scripted), progress=False))
    return d, cfg


def sorted_labels(run):
    t = run.read_table("labels/labels.parquet")
    return t.take(pc.sort_indices(t, [("doc_id", "ascending"), ("question_id", "ascending")])).to_pylist()


def test_streaming_labels_on_ray_equal_the_in_process_run(clustered_run, corpus_file, tmp_path, ray_local, monkeypatch):
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.progress import read_progress

    for mode in ("single", "packed"):
        d, cfg = questions_run(clustered_run, corpus_file, tmp_path / mode / "ray", answer_mode=mode)
        e, _ = questions_run(clustered_run, corpus_file, tmp_path / mode / "local", answer_mode=mode)
        ray_run, local_run = RunDir(str(d)), RunDir(str(e))
        monkeypatch.setenv("CQG_RAY_PROGRESS", "1")  # the workers relay requests and tokens to the driver's view
        on_ray = run_stage(ray_run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, progress=False))["counts"]
        monkeypatch.setenv("CQG_RAY_PROGRESS", "0")
        p = read_progress(ray_run)  # the answer pass's last line: every request finished in a worker, their tokens read
        assert (p["stage"], p["done"], p["total"], p["final"]) == ("labels", on_ray["prompts"], on_ray["prompts"], True)
        assert "prompt tokens read" in p["line"]
        fake = FakeBackend(cfg.llm)
        local = run_stage(local_run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))["counts"]
        assert on_ray == local and on_ray["pairs_labelled"] == on_ray["pairs_planned"] > 0
        assert sorted_labels(ray_run) == sorted_labels(local_run)
        assert ray_run.read_table("labels/question_stats.parquet") == local_run.read_table("labels/question_stats.parquet")
        assert len(Ledger(ray_run, "labels").shards()) == 1 and Ledger(ray_run, "labels").journals() == []  # the workers' journals, recovered
        stats = Ledger(ray_run, "labels").read_stats()
        assert stats["totals"]["requests"] == on_ray["prompts"] == stats["runs"][-1]["sent"]
        again = run_stage(ray_run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, progress=False), force=True)["counts"]
        assert again == on_ray and Ledger(ray_run, "labels").read_stats()["runs"][-1]["sent"] == 0


def start(run_dir, corpus_file, sent_log):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CQG_RAY_PROGRESS": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, str(Path(__file__).parent / "label_stream_job.py"), str(run_dir), str(corpus_file), str(sent_log)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def kill_tree(proc) -> None:
    """SIGKILL to the job and everything it started (its local Ray: GCS, raylet, the workers in their own groups)."""
    import psutil

    everyone = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    for pid in everyone:  # reaped or gone before the rerun starts
        try:
            psutil.Process(pid).wait(timeout=30)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired, psutil.AccessDenied):
            pass


def test_kill_9_of_the_streaming_label_job_resends_nothing_finished(clustered_run, corpus_file, tmp_path, ray_local):
    """SIGKILL to the job's whole process group (driver, its local Ray, the engine actors) while the engines answer;
    the rerun recovers the workers' journals and sends exactly the requests that never finished."""
    from cqg_ray.llm.ledger import Ledger

    from tests.mbqa.label_stream_job import KILL_LABELS

    d, cfg = questions_run(clustered_run, corpus_file, tmp_path / "run", label=KILL_LABELS)
    run = RunDir(str(d))
    sent_log = tmp_path / "sent.log"
    proc = start(d, corpus_file, sent_log)
    t0 = time.time()
    while not sent_log.exists() or len(sent_log.read_text().splitlines()) < 40:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < 300, "the job sent nothing"
        time.sleep(0.05)
    kill_tree(proc)
    first = sent_log.read_text().splitlines()
    finished = Ledger(run, "labels").columns().num_rows  # shards and journals: what finished before the kill
    assert 0 < finished <= len(first)
    assert Ledger(run, "labels").journals()  # nothing was in a shard yet: the journals saved it

    proc = start(d, corpus_file, sent_log)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    words = out.split()
    done_at = words.index("DONE")
    sent, from_ledger, labelled = (int(w) for w in words[done_at + 1: done_at + 4])
    second = sent_log.read_text().splitlines()[len(first):]
    assert from_ledger == finished and sent == len(second)
    assert len(set(second)) == len(second) == len(set(first) | set(second)) - finished
    assert len(set(second) & set(first)) == len(set(first)) - finished  # asked again: only what was in flight at the kill
    planned = RunDir(str(d)).manifest("labels")["counts"]["pairs_planned"]
    assert labelled == planned == sent + from_ledger
    assert Ledger(run, "labels").read_stats()["totals"]["requests"] == planned
