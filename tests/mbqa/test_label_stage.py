"""The labelling stage with the scripted LLM: plan -> A.3 prompts -> labels table; a rerun sends nothing."""


from cqg_ray.config import stage_hash
from cqg_ray.rundir import RunDir, run_stage
from tests.conftest import copy_clustered, small_config


def test_label_stage(clustered_run, corpus_file, tmp_path):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.artifacts import load_labels
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    # max_opening_share=1: the scripted questions all open "does the text talk about", and packing needs several of them
    cfg = small_config(d, corpus_file, max_clusters=4, max_opening_share=1.0, extra={"llm": {"answer_mode": "packed"}})
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
    from cqg_ray.llm.engines.fake import default_reply
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


def test_label_stage_with_p_yes_and_an_unreadable_text(clustered_run, corpus_file, tmp_path):
    """logprobs on: p_yes in the labels table; one text the LLM never answers in format: its prompts go to
    failures.parquet with the raw reply, after llm.max_attempts tries each, and the stats count them out."""
    import pyarrow.compute as pc

    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.artifacts import load_labels
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=4, extra={"llm": {"logprobs": True, "max_attempts": 2, "answer_mode": "packed"}})
    run = RunDir(str(d))
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=FakeBackend(cfg.llm, reply=scripted), progress=False))
    m_q = len(run.read_table("questions/questions.parquet"))
    bad_doc: list[str] = []

    def reply(req):
        if req.meta.get("doc_id") is not None and not bad_doc:
            bad_doc.append(req.meta["doc_id"])  # the first text asked about is the unreadable one
        if req.meta.get("doc_id") == (bad_doc[0] if bad_doc else None):
            return "I am not sure what you mean."
        return scripted(req)

    fake = FakeBackend(cfg.llm, reply=reply)
    m = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))
    c = m["counts"]
    bad_calls = [r for r in fake.calls if r.meta["doc_id"] == bad_doc[0]]
    bad_prompts = {tuple(r.meta["question_ids"]) for r in bad_calls}
    assert len(bad_calls) == 2 * len(bad_prompts)  # each asked max_attempts = 2 times
    fails = run.read_table("labels/failures.parquet").to_pylist()
    assert {tuple(f["question_ids"]) for f in fails} == bad_prompts and len(fails) == len(bad_prompts)
    assert all(f["doc_id"] == bad_doc[0] and f["text"] == "I am not sure what you mean." and f["error"] for f in fails)
    bad_pairs = sum(len(p) for p in bad_prompts)
    assert c["prompts_failed"] == len(bad_prompts)
    assert c["pairs_labelled"] == c["pairs_planned"] - bad_pairs == m_q * 12 - bad_pairs

    labels = load_labels(run)
    assert bad_doc[0] not in set(labels.column("doc_id").to_pylist())
    answers, p_yes = labels.column("answer").to_pylist(), labels.column("p_yes").to_pylist()
    assert p_yes == [1.0 if a else 0.0 for a in answers]  # the scripted LLM is certain; no nulls with logprobs on

    stats = run.read_table("labels/question_stats.parquet").to_pylist()
    for s in stats:
        mine = labels.filter(pc.equal(labels["question_id"], s["question_id"]))
        lost = sum(s["question_id"] in p for p in bad_prompts)
        assert s["planned"] == 12 and s["answered"] == 12 - lost == mine.num_rows
        assert s["yes"] == sum(mine.column("answer").to_pylist())
        assert s["yes_rate"] == s["yes"] / s["answered"]
    assert c["yes_rate"] == round(sum(answers) / len(answers), 4)


def test_label_stage_single_pass(clustered_run, corpus_file, tmp_path):
    """Single-pass labelling: one request per planned pair, P(yes) stored with every label, a text without a
    P(yes) is recorded as failed after one try (asking again gives the same logits), a rerun sends nothing."""
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.base import Completion
    from cqg_ray.llm.engines.fake import FakeBackend, default_reply
    from cqg_ray.artifacts import load_labels
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=4)
    run = RunDir(str(d))
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=FakeBackend(cfg.llm, reply=scripted), progress=False))
    m_q = len(run.read_table("questions/questions.parquet"))
    bad: list[str] = []

    def reply(req):
        if not bad:
            bad.append(req.meta["doc_id"])
        return Completion("maybe") if req.meta["doc_id"] == bad[0] else default_reply(req)

    fake = FakeBackend(cfg.llm, reply=reply)
    c = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))["counts"]
    assert all(r.yes_no and len(r.meta["question_ids"]) == 1 for r in fake.calls)
    bad_calls = [r for r in fake.calls if r.meta["doc_id"] == bad[0]]
    assert c["pairs_planned"] == m_q * 12 == c["prompts"]
    assert len(fake.calls) == c["prompts"]  # nobody asked twice, the failed ones included
    assert c["prompts_failed"] == len(bad_calls) and c["pairs_labelled"] == c["pairs_planned"] - len(bad_calls)
    labels = load_labels(run)
    want = {(r.meta["doc_id"], r.meta["question_ids"][0]): default_reply(r).p_yes[0] for r in fake.calls if r.meta["doc_id"] != bad[0]}
    got = {(d_, q): p for d_, q, p in zip(labels.column("doc_id").to_pylist(), labels.column("question_id").to_pylist(), labels.column("p_yes").to_pylist())}
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-6 for k in want)  # float32 in the table
    assert labels.column("answer").to_pylist() == [p > 0.5 for p in labels.column("p_yes").to_pylist()]
    fails = run.read_table("labels/failures.parquet").to_pylist()
    assert {f["doc_id"] for f in fails} == {bad[0]} and all("without a P(yes)" in f["error"] for f in fails)
    fake2 = FakeBackend(cfg.llm, reply=reply)
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake2, progress=False), force=True)
    assert fake2.calls == []


def test_cqg_and_label_prompts_fitted_to_a_small_context(clustered_run, corpus_file, tmp_path):
    """Fake engines with small contexts (600 tokens for generation, 90 for single-pass labels): every prompt sent
    fits, counted as the engine counts, and the manifests say how many were clipped and by how much."""
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    # A.1 (the property prompt's rules and worked examples alone take ~675 of the 600 tokens: a PromptTooLong, not a clip)
    cfg = small_config(d, corpus_file, max_clusters=3, max_text_chars=1000, prompt="paper", filters=[], extra={"label": {"max_text_chars": 1000}})
    assert cfg.llm.answer_mode == "single" and cfg.llm.max_tokens_generate == 200
    run = RunDir(str(d))
    fake = FakeBackend(cfg.llm, reply=scripted, n_ctx=600)
    budget = fake.prompt_budget()
    q = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))
    gen = [r for r in fake.calls if not r.yes_no]
    assert len(gen) == 3 and all(budget.count(r) <= 600 - 200 for r in gen)
    c = q["counts"]
    assert c["generation_prompts_checked"] == 3 and c["generation_prompts_clipped"] == 3 and c["generation_texts_dropped"] > 0
    assert c["generation_chars_cut"] > 0 and c["generation_longest_prompt_tokens"] > 600 - 200
    assert q["prompt_budget"] == {"context": 600, "counted_by": "fake (characters / 4)"}
    report = (d / "questions" / "report.md").read_text()
    assert "## Prompt length against the engine's context" in report
    assert f"| generation | 3 | 3 | {c['generation_texts_dropped']} | {c['generation_chars_cut']} |" in report
    probes = [r for r in fake.calls if r.yes_no]
    assert all(budget.count(r) <= 600 - 1 for r in probes) and c["probe_prompts_checked"] == len(probes) == c["probe_prompts"]
    small = FakeBackend(cfg.llm, reply=scripted, n_ctx=90)
    lab = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=small, progress=False))
    assert small.calls and all(small.prompt_budget().count(r) <= 90 - 1 for r in small.calls)
    lc = lab["counts"]
    assert lc["prompts_checked"] == lc["prompts"] == len(small.calls) and lc["prompts_clipped"] >= 1 and lc["chars_cut"] > 0
    assert lc["longest_prompt_tokens"] > 89 and lc["pairs_labelled"] == lc["pairs_planned"]


def test_label_stage_with_the_judges_prompt(clustered_run, corpus_file, tmp_path):
    """label.prompt=judge: every labelling request is the faithfulness judge's prompt after its worked examples, with no
    reply begun; the answers are read the same way, and the stage is stale against the labelling prompt's."""
    from cqg_ray.artifacts import load_labels
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend, default_reply
    from cqg_ray.llm.prompts import judge_shot_messages
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=4, extra={"label": {"prompt": "judge"}})
    run = RunDir(str(d))
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=FakeBackend(cfg.llm, reply=scripted), progress=False))
    questions = run.read_table("questions/questions.parquet").column("text").to_pylist()
    fake = FakeBackend(cfg.llm)
    c = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))["counts"]
    assert c["pairs_labelled"] == c["pairs_planned"] == len(fake.calls) == len(questions) * 12
    for r in fake.calls:
        text = r.messages[-1]["content"].split("\n\nText: ", 1)[1].rsplit("\n\nQuestion: ", 1)[0]
        assert r.messages == judge_shot_messages(text, questions[r.meta["question_ids"][0]])
        assert r.yes_no and r.answer_prefix == "" and r.max_tokens == 1
    labels = load_labels(run)
    want = {(r.meta["doc_id"], r.meta["question_ids"][0]): default_reply(r).p_yes[0] > 0.5 for r in fake.calls}
    assert dict(zip(zip(labels.column("doc_id").to_pylist(), labels.column("question_id").to_pylist()), labels.column("answer").to_pylist())) == want
    answer_cfg = small_config(d, corpus_file, max_clusters=4)
    assert stage_hash(answer_cfg, "labels") != stage_hash(cfg, "labels")
    assert run.state("labels", stage_hash(answer_cfg, "labels"), ["questions", "cluster", "prepare"]).state == "stale"


def test_single_pass_labels_are_p_yes_above_label_yes_above_and_made_again_from_the_ledger(clustered_run, corpus_file, tmp_path):
    """label.yes_above: a single-pass label is yes where P(yes) is above it; a run at another value makes its labels again
    from the ledger, asking nothing."""
    from cqg_ray.artifacts import load_labels
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.mbqa.label import run_labels
    from tests.cqg.test_stage import scripted

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=4)
    run = RunDir(str(d))
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=FakeBackend(cfg.llm, reply=scripted), progress=False))
    fake = FakeBackend(cfg.llm)
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=fake, progress=False))
    half = load_labels(run)
    p = half.column("p_yes").to_pylist()
    assert half.column("answer").to_pylist() == [x > 0.5 for x in p]
    high = small_config(d, corpus_file, max_clusters=4, extra={"label": {"yes_above": 0.7}})
    fake2 = FakeBackend(high.llm)
    c = run_stage(run, "labels", stage_hash(high, "labels"), lambda ctx: run_labels(high, ctx, backend=fake2, progress=False))["counts"]
    assert fake2.calls == []  # every answer came from the ledger
    labels = load_labels(run)
    assert labels.column("p_yes").to_pylist() == p
    assert labels.column("answer").to_pylist() == [x > 0.7 for x in p]
    assert 0 < sum(x > 0.7 for x in p) < sum(x > 0.5 for x in p)  # the fake's P(yes) straddle both thresholds
    assert c["yes_rate"] == round(sum(x > 0.7 for x in p) / len(p), 4)
