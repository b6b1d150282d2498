"""Ledger + runner with the scripted fake backend: resume, no repeats, retries, failures, accounting."""

import pytest

from cqg_ray.config import LLMConfig
from cqg_ray.llm.base import BackendError, Completion, Request, answer_gbnf, answer_regex
from cqg_ray.llm.engines.fake import FakeBackend, default_reply
from cqg_ray.llm.ledger import Ledger, request_key
from cqg_ray.llm.prompts import answer_messages, cqg_messages
from cqg_ray.llm.runner import RETRY_TEMPERATURE, answers_table, run_requests, stage_stats
from cqg_ray.rundir import RunDir


def answer_requests(n_texts=4, per_text=2, n_q=3):
    reqs = []
    for t in range(n_texts):
        for k in range(per_text):
            qs = [f"Is question {k}-{j} true?" for j in range(n_q)]
            reqs.append(Request(answer_messages(f"text number {t}", qs), max_tokens=50, n_answers=n_q, meta={"doc": t, "chunk": k}))
    return reqs


def fake_llm(**kw):
    return LLMConfig(backend="fake", **kw)


def test_results_align_with_input_and_duplicates_are_sent_once(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    reqs = answer_requests()
    reqs = reqs + [Request(reqs[0].messages, 50, 3, meta={"doc": "again"})]  # same prompt, other meta
    fb = FakeBackend(llm)
    res = run_requests(reqs, llm, run, "labels", backend=fb, progress=False)
    assert len(fb.calls) == 8
    assert len(res) == 9
    for r, q in zip(res, reqs):
        assert r.ok
        assert r.meta == q.meta
        assert r.answers == [line.endswith("yes") for line in default_reply(q).splitlines()]
        assert r.attempts == 1
        assert not r.cached
    assert res[8].key == res[0].key
    assert res[8].meta == {"doc": "again"}


def test_resume_sends_only_what_is_missing(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(flush_every=2)
    reqs = answer_requests()
    first = run_requests(reqs[:5], llm, run, "labels", backend=FakeBackend(llm), progress=False)
    fb = FakeBackend(llm)
    second = run_requests(reqs, llm, run, "labels", backend=fb, progress=False)
    assert sorted(c.meta["doc"] * 10 + c.meta["chunk"] for c in fb.calls) == [21, 30, 31]
    assert [r.cached for r in second] == [True] * 5 + [False] * 3
    assert [r.answers for r in second[:5]] == [r.answers for r in first]
    fb3 = FakeBackend(llm)
    third = run_requests(reqs, llm, run, "labels", backend=fb3, progress=False)
    assert fb3.calls == []
    assert all(r.cached for r in third)
    assert [r.answers for r in third] == [r.answers for r in second]


def test_meta_is_not_part_of_the_key_but_the_model_is():
    a = Request([{"role": "user", "content": "hi"}], 10, meta={"x": 1})
    b = Request([{"role": "user", "content": "hi"}], 10, meta={"x": 2})
    ident = {"backend": "fake", "model": "fake", "temperature": 0.0, "constrained": True}
    assert request_key(ident, a) == request_key(ident, b)
    assert request_key(ident, a) != request_key({**ident, "model": "other"}, a)
    assert request_key(ident, a) != request_key({**ident, "temperature": 0.5}, a)
    assert request_key(ident, a) != request_key(ident, Request(a.messages, 11))
    assert len(request_key(ident, a)) == 64


def test_changing_the_model_config_does_not_reuse_old_answers(tmp_path):
    run = RunDir(str(tmp_path))
    reqs = answer_requests(2, 1)
    run_requests(reqs, fake_llm(), run, "labels", backend=FakeBackend(fake_llm()), progress=False)
    llm2 = fake_llm(temperature=0.3)
    fb = FakeBackend(llm2)
    res = run_requests(reqs, llm2, run, "labels", backend=fb, progress=False)
    assert len(fb.calls) == 2
    assert not any(r.cached for r in res)


def test_unparseable_answer_is_retried_at_retry_temperature(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(max_attempts=3)
    seen = []

    def reply(req):
        seen.append((req.temperature, req.seed))
        return "I think the answer is yes" if req.seed is None else default_reply(req)

    reqs = answer_requests(1, 1)
    res = run_requests(reqs, llm, run, "labels", backend=FakeBackend(llm, reply=reply), progress=False)
    assert seen == [(None, None), (RETRY_TEMPERATURE, 2)]
    assert res[0].ok
    assert res[0].attempts == 2
    stats = stage_stats(run, "labels")
    assert stats["totals"]["retries"] == 1
    assert stats["runs"][-1]["retries"] == 1
    assert stats["runs"][-1]["sent"] == 2


def test_failure_is_recorded_with_raw_text_and_not_repeated(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(max_attempts=2)
    bad = FakeBackend(llm, reply=lambda r: "1. maybe\n2. perhaps\n3. dunno")
    res = run_requests(answer_requests(1, 1), llm, run, "labels", backend=bad, progress=False)
    assert len(bad.calls) == 2
    assert not res[0].ok
    assert res[0].answers is None
    assert res[0].text == "1. maybe\n2. perhaps\n3. dunno"
    assert res[0].error.startswith("unparseable: ")
    assert res[0].attempts == 2
    again = FakeBackend(llm)
    res2 = run_requests(answer_requests(1, 1), llm, run, "labels", backend=again, progress=False)
    assert again.calls == []
    assert not res2[0].ok and res2[0].cached
    fixed = FakeBackend(llm)
    res3 = run_requests(answer_requests(1, 1), llm, run, "labels", backend=fixed, progress=False, retry_failed=True)
    assert len(fixed.calls) == 1
    assert res3[0].ok
    assert stage_stats(run, "labels")["totals"]["failures"] == 0


def test_backend_row_error_is_retried(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    calls = []

    def reply(req):
        calls.append(req)
        return Completion("", error="engine hiccup") if len(calls) == 1 else default_reply(req)

    res = run_requests(answer_requests(1, 1), llm, run, "labels", backend=FakeBackend(llm, reply=reply), progress=False)
    assert res[0].ok and res[0].attempts == 2


def test_backend_exception_keeps_finished_results(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(flush_every=1000)  # nothing flushed by count: only the exception path writes
    n = []

    def reply(req):
        n.append(1)
        if len(n) == 4:
            raise BackendError("endpoint went away")
        return default_reply(req)

    reqs = answer_requests()
    with pytest.raises(BackendError, match="went away"):
        run_requests(reqs, llm, run, "labels", backend=FakeBackend(llm, reply=reply, batch_size=1), progress=False)
    assert len(Ledger(run, "labels").load()) == 3
    fb = FakeBackend(llm)
    res = run_requests(reqs, llm, run, "labels", backend=fb, progress=False)
    assert len(fb.calls) == 5
    assert sum(r.cached for r in res) == 3
    stats = stage_stats(run, "labels")
    assert [r["complete"] for r in stats["runs"]] == [False, True]
    assert stats["totals"]["requests"] == 8


def test_prompts_sharing_a_text_are_sent_together(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    reqs = answer_requests(3, 3)
    interleaved = [reqs[i] for i in (0, 3, 6, 1, 4, 7, 2, 5, 8)]
    fb = FakeBackend(llm)
    run_requests(interleaved, llm, run, "labels", backend=fb, progress=False)
    docs = [c.meta["doc"] for c in fb.calls]
    assert docs == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_generation_requests_are_not_parsed_as_answers(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    req = Request(cqg_messages(["a", "b"], ["c"]), max_tokens=400, meta={"cluster": 7})
    res = run_requests([req], llm, run, "questions", backend=FakeBackend(llm), progress=False)
    assert res[0].ok and res[0].answers is None
    assert res[0].text.startswith("1. Does the text mention topic ")
    assert res[0].meta == {"cluster": 7}


def test_stats_account_tokens_and_wall_time(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(flush_every=3)
    res = run_requests(answer_requests(), llm, run, "labels", backend=FakeBackend(llm), progress=False)
    stats = stage_stats(run, "labels")
    assert stats["stage"] == "labels"
    assert stats["model"] == {"backend": "fake", "model": "fake", "temperature": 0.0, "constrained": True}
    assert stats["totals"]["requests"] == 8
    assert stats["totals"]["prompt_tokens"] == sum(r.prompt_tokens for r in res)
    assert stats["totals"]["completion_tokens"] == sum(r.completion_tokens for r in res)
    assert stats["totals"]["failures"] == 0
    assert stats["totals"]["wall_s"] >= 0
    last = stats["runs"][-1]
    assert (last["requests"], last["unique"], last["from_ledger"], last["to_send"], last["sent"], last["finished"]) == (8, 8, 0, 8, 8, 8)
    assert last["complete"] is True
    assert len(Ledger(run, "labels").shards()) == 3  # 3 + 3 + 2


def test_p_yes_is_recorded_when_asked(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(logprobs=True)
    res = run_requests(answer_requests(1, 1), llm, run, "labels", backend=FakeBackend(llm), progress=False)
    assert res[0].p_yes == [1.0 if a else 0.0 for a in res[0].answers]


def test_answers_table_flattens_with_question_ids(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    reqs = [Request(answer_messages("t", ["Is a?", "Is b?"]), 20, 2, meta={"doc_id": 5, "question_ids": [10, 11]})]
    res = run_requests(reqs, llm, run, "labels", backend=FakeBackend(llm), progress=False)
    rows = answers_table(res)
    assert [(r["doc_id"], r["question_id"], r["line"]) for r in rows] == [(5, 10, 0), (5, 11, 1)]
    assert [r["answer"] for r in rows] == res[0].answers


def test_compaction_keeps_every_row(tmp_path):
    run = RunDir(str(tmp_path))
    llm = fake_llm(flush_every=1)
    reqs = answer_requests(10, 7)  # 70 requests -> 70 shards -> compacted
    run_requests(reqs, llm, run, "labels", backend=FakeBackend(llm), progress=False)
    ledger = Ledger(run, "labels")
    assert len(ledger.shards()) == 1
    assert len(ledger.load()) == 70
    fb = FakeBackend(llm)
    run_requests(reqs, llm, run, "labels", backend=fb, progress=False)
    assert fb.calls == []


def test_backend_that_loses_requests_is_an_error(tmp_path):
    class Lossy(FakeBackend):
        def stream(self, requests):
            for i, c in enumerate(self.complete(requests)):
                if i != 1:
                    yield i, c

    run = RunDir(str(tmp_path))
    llm = fake_llm()
    with pytest.raises(BackendError, match="no result for 1 of 3"):
        run_requests(answer_requests(3, 1), llm, run, "labels", backend=Lossy(llm), progress=False)
    assert len(Ledger(run, "labels").load()) == 2


def test_backend_identity_must_match_config(tmp_path):
    with pytest.raises(ValueError, match="does not match"):
        run_requests(answer_requests(1, 1), fake_llm(temperature=0.5), RunDir(str(tmp_path)), "labels", backend=FakeBackend(fake_llm()), progress=False)


def test_bad_requests_are_rejected(tmp_path):
    run = RunDir(str(tmp_path))
    for bad in (
        Request([], 10),
        Request([{"role": "user"}], 10),
        Request([{"role": "robot", "content": "x"}], 10),
        Request([{"role": "user", "content": "x"}], 0),
        Request([{"role": "user", "content": "x"}], 10, n_answers=0),
    ):
        with pytest.raises(ValueError):
            run_requests([bad], fake_llm(), run, "labels", backend=FakeBackend(fake_llm()), progress=False)


def test_grammar_and_regex_for_n_answers():
    assert answer_gbnf(2) == 'root ::= "1. " yn "\\n" "2. " yn "\\n"\nyn ::= "yes" | "no"\n'
    assert answer_regex(3) == "1\\. (yes|no)\\n2\\. (yes|no)\\n3\\. (yes|no)\\n"
    import re

    assert re.fullmatch(answer_regex(3), "1. yes\n2. no\n3. no\n")
    assert not re.fullmatch(answer_regex(3), "1. yes\n2. no\n")


def test_make_backend_dispatch():
    from cqg_ray.llm.backends import make_backend
    from cqg_ray.llm.engines.openai import OpenAIBackend
    from cqg_ray.llm.engines.vllm import VLLMBackend

    assert isinstance(make_backend(fake_llm()), FakeBackend)
    b = make_backend(LLMConfig(backend="openai"))
    assert isinstance(b, OpenAIBackend)
    b.close()
    assert isinstance(make_backend(LLMConfig(backend="vllm")), VLLMBackend)  # vllm itself is imported only when it runs


def test_fake_records_requests_only_when_asked():
    from cqg_ray.llm.backends import make_backend

    reqs = [Request(messages=[{"role": "user", "content": f"q{i}"}], max_tokens=8) for i in range(3)]
    run_fake = make_backend(fake_llm())  # what a pipeline run builds: a million requests must not stay in memory
    run_fake.complete(reqs)
    assert (run_fake.sent, run_fake.calls) == (3, [])
    test_fake = FakeBackend(fake_llm())
    test_fake.complete(reqs)
    assert (test_fake.sent, test_fake.calls) == (3, reqs)


def test_no_requests(tmp_path):
    assert run_requests([], fake_llm(), RunDir(str(tmp_path)), "labels", backend=FakeBackend(fake_llm()), progress=False) == []


def test_the_run_log_says_what_was_planned_read_and_sent(tmp_path, caplog):
    """One line per LLM stage before anything is sent: a user reads from it that nothing was paid twice."""
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    reqs = answer_requests()  # 8 requests
    with caplog.at_level("INFO", logger="cqg_ray"):
        run_requests(reqs[:5], llm, run, "labels", backend=FakeBackend(llm), progress=False)
        run_requests(reqs, llm, run, "labels", backend=FakeBackend(llm), progress=False)
        again = FakeBackend(llm)
        run_requests(reqs, llm, run, "labels", backend=again, progress=False)
    lines = [r.getMessage() for r in caplog.records if "to send" in r.getMessage()]
    assert lines == ["llm labels: 5 requests, 5 unique, 0 from the ledger, 5 to send",
                     "llm labels: 8 requests, 8 unique, 5 from the ledger, 3 to send",
                     "llm labels: 8 requests, 8 unique, 8 from the ledger, 0 to send"]
    assert again.calls == []
    runs = stage_stats(run, "labels")["runs"]
    assert [(r["requests"], r["from_ledger"], r["to_send"], r["sent"]) for r in runs] == [(5, 0, 5, 5), (8, 5, 3, 3), (8, 8, 0, 0)]


def test_a_resume_reads_keys_not_results_and_shards_are_large(tmp_path, monkeypatch):
    """At the defaults one run of 70 requests is one shard; a rerun never loads the whole ledger (keys and
    accounting columns only, then the rows of its own keys)."""
    run = RunDir(str(tmp_path))
    llm = fake_llm()
    assert (llm.flush_every, llm.flush_s) == (50_000, 60.0)
    reqs = answer_requests(10, 7)
    first = run_requests(reqs[:40], llm, run, "labels", backend=FakeBackend(llm), progress=False)
    assert len(Ledger(run, "labels").shards()) == 1
    monkeypatch.setattr(Ledger, "load", lambda self: (_ for _ in ()).throw(AssertionError("the whole ledger was read")))
    fb = FakeBackend(llm)
    second = run_requests(reqs, llm, run, "labels", backend=fb, progress=False)
    assert len(fb.calls) == 30 and len(Ledger(run, "labels").shards()) == 2
    assert [r.answers for r in second[:40]] == [r.answers for r in first] and [r.cached for r in second] == [True] * 40 + [False] * 30
    assert stage_stats(run, "labels")["totals"]["requests"] == 70
