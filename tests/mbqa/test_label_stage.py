"""The labelling stage with the scripted LLM: plan -> A.3 prompts -> labels table; a rerun sends nothing."""

import numpy as np

from cqg_ray.config import stage_hash
from cqg_ray.rundir import RunDir, run_stage
from tests.conftest import copy_clustered, small_config


def test_label_stage(clustered_run, corpus_file, tmp_path):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.fake import FakeBackend
    from cqg_ray.mbqa.label import load_labels, run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=4)
    run = RunDir(str(d))
    fake = FakeBackend(cfg.llm, reply=scripted)
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))
    m_q = len(run.read_table("questions/questions.parquet"))
    fake.calls.clear()
    m = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))
    c = m["counts"]
    assert c["questions"] == m_q
    assert c["pairs_planned"] == m_q * (6 + 4 + 2)
    assert c["pairs_labelled"] == c["pairs_planned"]  # the scripted LLM always answers in format
    assert c["prompts"] == len(fake.calls)
    assert all(r.n_answers <= 20 for r in fake.calls)
    assert c["prompts"] < c["pairs_planned"]  # packing: several questions per prompt
    labels = load_labels(run)
    pairs = set(zip(labels.column("doc_id").to_pylist(), labels.column("question_id").to_pylist()))
    assert len(pairs) == labels.num_rows  # every pair exactly once
    assert set(labels.column("source").to_pylist()) <= {"cluster", "neighbor", "random"}
    # the answer recorded for a pair is the one the LLM gave on that prompt's line
    call = fake.calls[0]
    from cqg_ray.llm.fake import default_reply
    from cqg_ray.llm.parse import parse_answers

    expect = parse_answers(default_reply(call), call.n_answers)
    got = labels.filter(__import__("pyarrow").compute.equal(labels["doc_id"], call.meta["doc_id"]))
    got = dict(zip(got.column("question_id").to_pylist(), got.column("answer").to_pylist()))
    assert [got[q] for q in call.meta["question_ids"]] == expect
    stats = run.read_table("labels/question_stats.parquet")
    assert stats.column("answered").to_pylist() == [12] * m_q
    fake2 = FakeBackend(cfg.llm, reply=scripted)
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake2, progress=False), force=True)
    assert fake2.calls == []
