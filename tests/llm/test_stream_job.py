"""The one-job answer pass (the vLLM path's pipeline: plan -> request rows -> engine stage -> ledger) on a real local
Ray, with the fake engine as the engine stage: the same labels as the in-process passes, retries included."""

import hashlib
from functools import partial

import pyarrow.compute as pc
import pytest

from cqg_ray.config import stage_hash
from cqg_ray.rundir import RunDir, run_stage
from tests.mbqa.test_label_stream import questions_run


def unreadable_first(req):
    """A third of the packed prompts get an unreadable reply at the first attempt (no seed), a readable one after."""
    from cqg_ray.llm.engines.fake import default_reply

    prompt = "\n".join(m["content"] for m in req.messages)
    if req.n_answers is not None and req.seed is None and hashlib.sha256(prompt.encode()).digest()[0] % 3 == 0:
        return "I cannot answer that."
    return default_reply(req)


def sorted_labels(run):
    t = run.read_table("labels/labels.parquet")
    return t.take(pc.sort_indices(t, [("doc_id", "ascending"), ("question_id", "ascending")])).to_pylist()


@pytest.mark.ray
def test_one_job_labels_equal_the_in_process_passes_with_retries(clustered_run, corpus_file, tmp_path, ray_local):
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.mbqa.label import run_labels

    d, cfg = questions_run(clustered_run, corpus_file, tmp_path / "job", answer_mode="packed")
    e, _ = questions_run(clustered_run, corpus_file, tmp_path / "local", answer_mode="packed")
    job_run, local_run = RunDir(str(d)), RunDir(str(e))
    engine = partial(FakeBackend, cfg.llm, reply=unreadable_first)
    on_job = run_stage(job_run, "labels", stage_hash(cfg, "labels"),
                       lambda ctx: run_labels(cfg, ctx, engine=engine, one_job=True, progress=False))["counts"]
    local = run_stage(local_run, "labels", stage_hash(cfg, "labels"),
                      lambda ctx: run_labels(cfg, ctx, backend=FakeBackend(cfg.llm, reply=unreadable_first), progress=False))["counts"]
    assert on_job == local and on_job["pairs_labelled"] == on_job["pairs_planned"] > 0 and on_job["prompts_failed"] == 0
    assert sorted_labels(job_run) == sorted_labels(local_run)
    job_stats, local_stats = (Ledger(r, "labels").read_stats()["runs"][-1] for r in (job_run, local_run))
    assert job_stats["retries"] == local_stats["retries"] > 0  # the unreadable third went again, in a second job
    assert job_stats["sent"] == local_stats["sent"] == on_job["prompts"] + local_stats["retries"]
    assert Ledger(job_run, "labels").journals() == [] and len(Ledger(job_run, "labels").shards()) == 2  # each attempt's journals, one shard
    attempts = Ledger(job_run, "labels").columns(["attempts"]).column("attempts").to_pylist()
    assert sorted(set(attempts)) == [1, 2] and attempts.count(2) == job_stats["retries"]
    again = run_stage(job_run, "labels", stage_hash(cfg, "labels"),
                      lambda ctx: run_labels(cfg, ctx, engine=engine, one_job=True, progress=False), force=True)["counts"]
    assert again == on_job and Ledger(job_run, "labels").read_stats()["runs"][-1]["sent"] == 0
