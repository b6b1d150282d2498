"""OpenAI-compatible backend: request bodies, response parsing, and a misbehaving local server."""

import math
import re

import pytest

from cqg_ray.config import LLMConfig, OpenAIConfig
from cqg_ray.llm.base import BackendError, Request, answer_gbnf
from cqg_ray.llm.ledger import Ledger
from cqg_ray.llm.engines.openai import OpenAIBackend, OpenAIError, backoff_delay, chat_body, completion_from_json, sse_data, streamed_completion
from cqg_ray.llm.parse import parse_answers, parse_questions
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.ports import free_port

from .fake_openai_server import FakeOpenAIServer, reply_for


def llm_for(base_url: str, **kw) -> LLMConfig:
    top = {k: kw.pop(k) for k in list(kw) if k in ("logprobs", "constrained", "max_attempts", "flush_every")}
    cfg = {"base_url": base_url, "model": "local", "timeout_s": 5.0, "max_retries": 3, "backoff_s": 0.01, **kw}
    return LLMConfig(backend="openai", openai=OpenAIConfig(**cfg), **top)


def areq(text="Apple is a technology company.", n=3, **meta):
    return Request(answer_messages(text, [f"Is it about topic {i}?" for i in range(n)]), max_tokens=40, n_answers=n, meta=meta)


# ----------------------------------------------------------------------------- pure parts


def test_chat_body_plain():
    llm = llm_for("http://x/v1")
    body = chat_body(llm, areq(), 0.0)
    assert body == {"model": "local", "messages": areq().messages, "max_tokens": 40, "temperature": 0.0}


def test_chat_body_constraints_logprobs_seed_extra():
    llm = llm_for("http://x/v1", send_grammar=True, send_structured_outputs=True, extra_body={"repeat_penalty": 1.0}, logprobs=True)
    r = areq(n=2)
    r.seed = 7
    body = chat_body(llm, r, 0.7)
    assert body["grammar"] == answer_gbnf(2)
    assert body["structured_outputs"] == {"regex": "1\\. (yes|no)\\n2\\. (yes|no)\\n"}
    assert body["repeat_penalty"] == 1.0
    assert (body["logprobs"], body["top_logprobs"], body["seed"], body["temperature"]) == (True, 5, 7, 0.7)
    gen = chat_body(llm, Request([{"role": "user", "content": "hi"}], 10), 0.0)
    assert "grammar" not in gen and "structured_outputs" not in gen and "logprobs" not in gen
    unconstrained = chat_body(llm_for("http://x/v1", send_grammar=True, constrained=False), r, 0.0)
    assert "grammar" not in unconstrained


def test_completion_from_json_reads_usage_and_logprobs():
    data = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "1. yes\n"},
                "logprobs": {
                    "content": [
                        {"token": "1", "logprob": 0.0, "top_logprobs": []},
                        {"token": ".", "logprob": 0.0, "top_logprobs": []},
                        {"token": " yes", "logprob": math.log(0.75),
                         "top_logprobs": [{"token": " yes", "logprob": math.log(0.75)}, {"token": " no", "logprob": math.log(0.25)}]},
                        {"token": "\n", "logprob": 0.0, "top_logprobs": []},
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4},
    }
    c = completion_from_json(data, areq(n=1), want_p_yes=True)
    assert (c.text, c.prompt_tokens, c.completion_tokens, c.error) == ("1. yes\n", 11, 4, None)
    assert c.p_yes == [pytest.approx(0.75)]
    assert completion_from_json(data, areq(n=1), want_p_yes=False).p_yes is None


def test_completion_from_json_malformed_is_a_row_error():
    c = completion_from_json({"oops": 1}, areq(), want_p_yes=False)
    assert c.error.startswith("malformed chat completion")
    assert completion_from_json({"choices": [{"message": {"content": None}}]}, areq(), False).text == ""
    msg = {"message": {"content": "1. yes\n2. no\n3. yes"}}
    single = Request([{"role": "user", "content": "x"}], max_tokens=1, yes_no=True)
    lp = lambda *content: {"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": list(content)}}]}  # noqa: E731
    for body, req in [({"choices": [{"message": {"content": 5}}]}, areq()), ({"choices": [{"message": {"content": ["1. yes"]}}]}, areq()),
                      ({"choices": [msg], "usage": "n/a"}, areq()), ({"choices": [msg], "usage": {"prompt_tokens": "abc"}}, areq()),
                      ({"choices": [msg], "usage": {"prompt_tokens_details": {"cached_tokens": "x"}}}, areq()),
                      (lp({"token": "Yes", "logprob": "abc"}), single), (lp({"token": "Yes", "logprob": float("nan")}), single),
                      (lp({"token": "Yes", "logprob": -0.1, "top_logprobs": [{"logprob": -1}]}), single),
                      ({"choices": [{"message": {"content": "Yes"}, "logprobs": [1, 2]}]}, single), (lp("Yes"), single), ([1, 2], areq())]:
        c = completion_from_json(body, req, want_p_yes=True)  # one request's error, never an exception that stops the stage
        assert c.error.startswith("malformed chat completion (") and c.text == "", body
    c = completion_from_json(lp({"token": "Yes", "logprob": 1000.0, "top_logprobs": [{"token": "No", "logprob": -50.0}]}), single, True)
    assert c.error is None and c.p_yes[0] > 0.999  # a logprob above 0 (a server's rounding) counts as 0


def test_backoff_delay():
    assert [backoff_delay(k, 1.0) for k in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_delay(10, 1.0) == 60.0
    assert backoff_delay(0, 1.0, "5") == 5.0
    assert backoff_delay(3, 1.0, "2") == 8.0
    assert backoff_delay(0, 1.0, "Wed, 21 Oct 2026 07:28:00 GMT") == 1.0


# ----------------------------------------------------------------------------- against a local server


def test_ok_answers_parse():
    with FakeOpenAIServer() as srv, OpenAIBackend(llm_for(srv.base_url)) as b:
        outs = b.complete([areq("t1"), areq("t2")])
    assert [o.text for o in outs] == [reply_for(areq("t1").messages[0]["content"]), reply_for(areq("t2").messages[0]["content"])]
    assert all(len(parse_answers(o.text, 3)) == 3 for o in outs)
    assert outs[0].prompt_tokens > 0 and outs[0].completion_tokens > 0
    assert srv.requests[0]["model"] == "local"
    assert "authorization" not in {k.lower() for k in srv.headers[0]}


def test_500_and_429_are_retried_with_backoff():
    sleeps = []
    with FakeOpenAIServer(script=["500", "503", "429"], retry_after="0.5") as srv:
        with OpenAIBackend(llm_for(srv.base_url, backoff_s=0.01), sleep=sleeps.append) as b:
            out = b.complete([areq()])[0]
            assert (b.http_calls, b.http_retries) == (4, 3)
    assert out.error is None and len(parse_answers(out.text, 3)) == 3
    assert sleeps == [0.01, 0.02, 0.5]  # the 429's Retry-After wins over the backoff
    assert len(srv.requests) == 4


def test_hanging_server_times_out_and_is_retried():
    with FakeOpenAIServer(script=["hang:3"]) as srv:
        with OpenAIBackend(llm_for(srv.base_url, timeout_s=0.3)) as b:
            out = b.complete([areq()])[0]
            assert b.http_retries == 1
    assert out.error is None and len(parse_answers(out.text, 3)) == 3


def test_dropped_connection_is_retried():
    with FakeOpenAIServer(script=["close"]) as srv, OpenAIBackend(llm_for(srv.base_url)) as b:
        out = b.complete([areq()])[0]
        assert b.http_retries == 1
    assert out.error is None


@pytest.mark.parametrize("status", ["401", "403", "404"])
def test_setup_errors_stop_at_once_with_the_servers_message(status):
    with FakeOpenAIServer(script=[status]) as srv, OpenAIBackend(llm_for(srv.base_url)) as b:
        with pytest.raises(OpenAIError, match=rf"HTTP {status} \(check base_url, model and api_key_env\).*scripted {status}"):
            b.complete([areq()])
        assert len(srv.requests) == 1


def test_a_refused_request_is_its_own_error_and_not_retried():
    with FakeOpenAIServer(script=["400", "ok"]) as srv, OpenAIBackend(llm_for(srv.base_url, max_concurrency=1)) as b:
        bad, good = b.complete([areq("too long"), areq("fine")])
        assert b.counters() == {"http_calls": 2, "http_retries": 0, "http_request_errors": 1}
    assert bad.final and bad.error.startswith("HTTP 400 (this request was refused)") and "scripted 400" in bad.error
    assert good.error is None and not good.final
    assert len(srv.requests) == 2


def test_runner_records_a_refused_request_as_failed_and_goes_on(tmp_path):
    run = RunDir(str(tmp_path))
    reqs = [areq(f"text {i}", doc=i) for i in range(5)]
    with FakeOpenAIServer(script=["ok", "413", "ok", "ok", "ok"]) as srv:
        llm = llm_for(srv.base_url, max_concurrency=1, max_attempts=3)
        res = run_requests(reqs, llm, run, "labels", progress=False)
        assert len(srv.requests) == 5  # the refused one was asked once, not max_attempts times
        assert [r.ok for r in res] == [True, False, True, True, True]
        assert res[1].attempts == 1 and "HTTP 413" in res[1].error and "scripted 413" in res[1].error
        stats = Ledger(run, "labels").read_stats()
        assert stats["totals"]["failures"] == 1
        assert stats["runs"][-1]["http_request_errors"] == 1 and stats["runs"][-1]["http_calls"] == 5
        again = run_requests(reqs, llm, run, "labels", progress=False)
        assert len(srv.requests) == 5 and again[1].cached and not again[1].ok  # a failure is not asked again...
        fixed = run_requests(reqs, llm.model_copy(update={"retry_failed": True}), run, "labels", progress=False)
        assert len(srv.requests) == 6 and fixed[1].ok  # ...unless llm.retry_failed


def test_an_endpoint_refusing_everything_stops_the_stage():
    with FakeOpenAIServer(script=["400"] * 40) as srv, OpenAIBackend(llm_for(srv.base_url, max_concurrency=1)) as b:
        with pytest.raises(OpenAIError, match="refused 32 requests in a row"):
            b.complete([areq(f"text {i}") for i in range(40)])
        assert len(srv.requests) == 32


def test_garbage_200_is_a_row_error():
    with FakeOpenAIServer(script=["garbage"]) as srv, OpenAIBackend(llm_for(srv.base_url)) as b:
        out = b.complete([areq()])[0]
    assert out.error.startswith("malformed chat completion")


def test_unreachable_endpoint_gives_up_after_retries():
    sleeps = []
    llm = llm_for(f"http://127.0.0.1:{free_port()}/v1", max_retries=2, backoff_s=0.5)
    with OpenAIBackend(llm, sleep=sleeps.append) as b:
        with pytest.raises(BackendError, match="no answer after 3 tries; last error: ConnectError"):
            b.complete([areq()])
    assert sleeps == [0.5, 1.0]


def test_api_key_from_environment(monkeypatch):
    monkeypatch.delenv("CQG_TEST_KEY", raising=False)
    with pytest.raises(BackendError, match="CQG_TEST_KEY"):
        OpenAIBackend(llm_for("http://127.0.0.1:9/v1", api_key_env="CQG_TEST_KEY"))
    monkeypatch.setenv("CQG_TEST_KEY", "sekret")
    with FakeOpenAIServer() as srv, OpenAIBackend(llm_for(srv.base_url, api_key_env="CQG_TEST_KEY")) as b:
        b.complete([areq()])
    assert {k.lower(): v for k, v in srv.headers[0].items()}["authorization"] == "Bearer sekret"


def test_concurrency_is_bounded():
    with FakeOpenAIServer(delay_s=0.1) as srv, OpenAIBackend(llm_for(srv.base_url, max_concurrency=3)) as b:
        outs = b.complete([areq(f"text {i}") for i in range(12)])
    assert all(o.error is None for o in outs)
    assert 2 <= srv.max_inflight <= 3


def test_runner_over_a_flaky_server_loses_nothing_and_repeats_nothing(tmp_path):
    run = RunDir(str(tmp_path))
    reqs = [areq(f"text {i}", doc=i) for i in range(20)]
    script = ["500", "ok", "429", "ok", "close", "garbage", "ok", "503"] * 3
    with FakeOpenAIServer(script=script) as srv:
        # 15 scripted failures in all: 16 tries per request always get through, whatever the interleaving
        llm = llm_for(srv.base_url, max_concurrency=4, flush_every=5, max_retries=15, backoff_s=0.0001)
        res = run_requests(reqs, llm, run, "labels", progress=False)
        assert all(r.ok for r in res)
        assert [r.meta["doc"] for r in res] == list(range(20))
        for r, q in zip(res, reqs):
            assert r.text == reply_for(q.messages[0]["content"])
        answered = [b["messages"][0]["content"] for b in srv.requests]
        assert len(set(answered)) == 20
        n_before = len(srv.requests)
        res2 = run_requests(reqs, llm, run, "labels", progress=False)
        assert len(srv.requests) == n_before  # nothing sent again
        assert all(r.cached for r in res2)
    assert len(Ledger(run, "labels").load()) == 20


def test_server_going_down_midway_keeps_finished_results(tmp_path):
    run = RunDir(str(tmp_path))
    reqs = [areq(f"text {i}", doc=i) for i in range(10)]
    with FakeOpenAIServer(script=["ok"] * 4 + ["500"] * 100) as srv:
        llm = llm_for(srv.base_url, max_concurrency=1, max_retries=1, flush_every=100)
        with pytest.raises(BackendError, match="no answer after 2 tries"):
            run_requests(reqs, llm, run, "labels", progress=False)
    assert len(Ledger(run, "labels").load()) == 4
    with FakeOpenAIServer() as srv2:
        llm2 = llm_for(srv2.base_url, max_concurrency=1, max_retries=1, flush_every=100)
        res = run_requests(reqs, llm2, run, "labels", progress=False)
        assert len(srv2.requests) == 6
    assert all(r.ok for r in res)
    assert sum(r.cached for r in res) == 4


def test_http_counters_are_per_run_when_a_backend_serves_two_stages(tmp_path):
    run = RunDir(str(tmp_path))
    with FakeOpenAIServer(script=["ok", "ok", "ok", "500", "ok", "ok"]) as srv:
        llm = llm_for(srv.base_url, max_concurrency=1)
        with OpenAIBackend(llm, sleep=lambda s: None) as b:
            run_requests([areq(f"first {i}") for i in range(3)], llm, run, "generate", progress=False, backend=b)
            run_requests([areq(f"second {i}") for i in range(2)], llm, run, "probe", progress=False, backend=b)
            assert b.counters() == {"http_calls": 6, "http_retries": 1, "http_request_errors": 0}
    first = Ledger(run, "generate").read_stats()["runs"][-1]
    second = Ledger(run, "probe").read_stats()["runs"][-1]
    assert (first["http_calls"], first["http_retries"]) == (3, 0)
    assert (second["http_calls"], second["http_retries"]) == (3, 1)  # not the backend's running totals


def test_single_pass_body_and_reply():
    """One token, top_logprobs 20, the reply prefix continued (vLLM's chat parameters); P(yes) from the first position."""
    from cqg_ray.llm.answers import answer_requests

    llm = llm_for("http://x/v1", send_grammar=True)
    req = answer_requests("A cat sat.", [0], ["Is it about an animal?"], "single", 20, 200)[0]
    body = chat_body(llm, req, 0.0)
    assert body["messages"] == [*req.messages, {"role": "assistant", "content": "1."}]
    assert (body["max_tokens"], body["logprobs"], body["top_logprobs"], body["continue_final_message"],
            body["add_generation_prompt"]) == (1, True, 20, True, False)
    assert "grammar" not in body
    data = {"choices": [{"message": {"content": " No"}, "logprobs": {"content": [{"token": " No", "logprob": math.log(0.7),
            "top_logprobs": [{"token": " No", "logprob": math.log(0.7)}, {"token": " Yes", "logprob": math.log(0.1)}]}]}}],
            "usage": {"prompt_tokens": 80, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 64}}}
    c = completion_from_json(data, req, False)
    assert c.p_yes == [pytest.approx(0.125)] and c.cached_tokens == 64 and c.error is None
    bare = completion_from_json({"choices": [{"message": {"content": "No"}}], "usage": {}}, req, False)
    assert bare.p_yes is None and "without yes/no logprobs" in bare.error


# ----------------------------------------------------------------------------- question lists streamed, loops closed


def chunk(content=None, usage=None):
    return {"choices": [] if content is None else [{"index": 0, "delta": {"content": content}}], **({"usage": usage} if usage else {})}


def test_a_streamed_list_is_read_until_it_loops():
    lines = ["1. Is it red?\n", "2. Is it blue?\n", "3. Is it red?\n", "4. Is it blue?\n", "5. Is it red?\n"]
    words = [w for line in lines for w in re.findall(r"\S+\s*", line)]  # "1. " "Is " "it " "red?\n": 4 a line
    looped = streamed_completion(iter([chunk("Here:\n"), *map(chunk, words), chunk(usage={"prompt_tokens": 9})]))
    assert (looped.text, looped.prompt_tokens, looped.completion_tokens) == ("Here:\n" + "".join(lines[:4]), 0, 1 + 16)
    plain = streamed_completion(iter([chunk("1. Is it red?\n"), chunk("2. Is it blue?"), chunk(usage={"prompt_tokens": 9, "completion_tokens": 12}), None]))
    assert (plain.text, plain.prompt_tokens, plain.completion_tokens, plain.error) == ("1. Is it red?\n2. Is it blue?", 9, 12, None)
    no_usage = streamed_completion(iter([chunk("1. Is it red?"), chunk(None), chunk(""), None]))
    assert (no_usage.text, no_usage.prompt_tokens, no_usage.completion_tokens, no_usage.error) == ("1. Is it red?", 0, 1, None)
    finished = {"choices": [{"index": 0, "delta": {"content": "?"}, "finish_reason": "length"}]}
    assert streamed_completion(iter([chunk("1. Is it red"), finished])).text == "1. Is it red?"  # a finish_reason ends it too
    cut = streamed_completion(iter([chunk("1. Is it red?\n"), chunk("2. Is")]))  # neither: the stream broke off
    assert cut.text == "" and "stopped before its end" in cut.error
    assert "malformed chat completion stream" in streamed_completion(iter([{"choices": [{"delta": {"content": 3}}]}])).error
    assert "malformed" in streamed_completion(sse_data(["data: {not json"])).error
    assert list(sse_data([": comment", "", "event: x", 'data: {"a": 1}', "data: [DONE]", 'data: {"b": 2}'])) == [{"a": 1}, None]


def test_a_list_closed_at_its_loop_counts_its_prompt_with_the_servers_tokenize():
    """The usage chunk comes at a stream's end, so a list closed at its loop had 0 prompt tokens (against vLLM too):
    they are now the server's /tokenize count, asked once for that reply; a server without /tokenize leaves 0 and is
    not asked again; a list that ends normally keeps its usage's count."""
    content = "Write questions. LOOP"
    loop = Request([{"role": "user", "content": content}], max_tokens=400, stop_on_loop=True)
    fine = Request([{"role": "user", "content": "Write questions."}], max_tokens=400, stop_on_loop=True)
    with FakeOpenAIServer(max_model_len=4096) as srv:
        with OpenAIBackend(llm_for(srv.base_url)) as b:
            looped, ended = b.complete([loop])[0], b.complete([fine])[0]
        assert (looped.prompt_tokens, looped.completion_tokens) == (len(content) // 4 + 10, 28) and srv.tokenize_calls == 1
        assert ended.prompt_tokens == len("Write questions.") // 4 and srv.tokenize_calls == 1  # its usage chunk's
    with FakeOpenAIServer() as srv:  # no /tokenize (404)
        with OpenAIBackend(llm_for(srv.base_url)) as b:
            first, second = b.complete([loop])[0], b.complete([loop])[0]
            assert b._no_tokenize
    assert (first.prompt_tokens, second.prompt_tokens, first.error, second.text) == (0, 0, None, first.text)


def test_a_question_list_is_streamed_and_closed_where_it_loops():
    """A stop_on_loop request is streamed and the stream closed at its loop (the server stops sending); its tokens are
    the usage chunk's where the stream ends; other requests, and stop_loops: false, ask for one JSON reply as before."""
    loop = Request([{"role": "user", "content": "Write questions. LOOP"}], max_tokens=400, stop_on_loop=True)
    fine = Request([{"role": "user", "content": "Write questions."}], max_tokens=400, stop_on_loop=True)
    with FakeOpenAIServer(script=["500"]) as srv:
        with OpenAIBackend(llm_for(srv.base_url), sleep=lambda s: None) as b:
            outs = b.complete([loop])  # the 500 first: a stream is retried like any call
            outs += b.complete([fine, areq()])
            assert (b.http_calls, b.http_retries) == (4, 1)
        with OpenAIBackend(llm_for(srv.base_url, stop_loops=False)) as b:
            whole = b.complete([loop])[0]
    assert outs[0].text == "1. Is the text about a movie?\n2. Is the text about a comedy?\n3. Is the text about a movie?\n4. Is the text about a comedy?\n"
    assert list(parse_questions(outs[0].text)) == ["Is the text about a movie?", "Is the text about a comedy?"]
    assert outs[0].error is None and outs[0].completion_tokens == 28  # the words read, a chunk each
    assert outs[1].text == reply_for("Write questions.") and outs[1].prompt_tokens == len("Write questions.") // 4 > 0
    assert outs[1].completion_tokens == 21 and len(parse_answers(outs[2].text, 3)) == 3
    asked = [(r["messages"][-1]["content"][:16], r.get("stream"), r.get("stream_options")) for r in srv.requests]
    streamed = ("Write questions.", True, {"include_usage": True})
    assert asked[:2] == [("Write questions.", True, {"include_usage": True})] * 2 and asked[4] == ("Write questions.", None, None)
    assert sorted(asked[2:4], key=str) == sorted([streamed, (areq().messages[0]["content"][:16], None, None)], key=str)
    (sent, total), (all_sent, _) = sorted(srv.streams, key=lambda s: -s[1])
    assert total == 60 * 7 and sent < total // 2 and all_sent == 21  # the looping stream was closed early; the other ran out
    assert whole.text == reply_for("Write questions. LOOP") and len(srv.requests) == 5


def test_a_stream_cut_short_is_asked_again_and_a_server_that_does_not_stream_is_read_whole():
    fine = Request([{"role": "user", "content": "Write questions."}], max_tokens=400, stop_on_loop=True)
    with FakeOpenAIServer(script=["cut", "nostream"]) as srv:
        with OpenAIBackend(llm_for(srv.base_url)) as b:
            cut = b.complete([fine])[0]
            whole = b.complete([fine])[0]
    assert cut.text == "" and "stopped before its end" in cut.error  # the runner asks again, as for an unreadable reply
    assert whole.error is None and whole.text == reply_for("Write questions.") and whole.prompt_tokens > 0
    assert [r.get("stream") for r in srv.requests] == [True, True] and srv.streams == [(10, 21)]


def test_an_error_event_in_a_stream_is_that_requests_error_and_asked_again(tmp_path):
    """vLLM's server, its engine failing after the 200 (its engine core killed mid-stream, measured with vLLM 0.32),
    sends ``data: {"error": {...}}`` then ``data: [DONE]``: the reply so far is not the answer (it was read as one, a
    list cut short recorded as finished); the runner asks again."""
    failed = streamed_completion(iter([chunk("1. Is it red?\n"), chunk("2. Is"), {"error": {"message": "engine died", "code": 500}}, None]))
    assert failed.text == "" and failed.error == 'the server reported an error in the stream after 2 chunks: {"message": "engine died", "code": 500}'
    fine = Request([{"role": "user", "content": "Write questions."}], max_tokens=400, stop_on_loop=True)
    with FakeOpenAIServer(script=["streamerror"]) as srv:
        res = run_requests([fine], llm_for(srv.base_url, max_attempts=3), RunDir(str(tmp_path)), "cqg-generate", progress=False)[0]
    assert res.ok and res.text == reply_for("Write questions.") and res.attempts == 2
    assert len(srv.requests) == 2 and srv.streams == [(12, 21), (21, 21)]  # ten words, the error and [DONE]; then all 21
