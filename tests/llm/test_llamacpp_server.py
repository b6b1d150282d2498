"""The OpenAI backend against a real OpenAI-compatible server: ``python -m llama_cpp.server`` on 127.0.0.1."""

import re
import subprocess
import sys
import time

import pytest

from cqg_ray.config import LLMConfig, OpenAIConfig
from cqg_ray.llm.base import Request, answer_regex
from cqg_ray.llm.engines.bundled import BundledModelError, resolve_model
from cqg_ray.llm.engines.openai import OpenAIBackend
from cqg_ray.llm.parse import parse_answers
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS
from tests.llm.servers import start_server, stop_server
from tests.ports import free_port

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp.server.app")

QUESTIONS = ["Is the text about a building?", "Does the text mention a year?", "Is the text a recipe?"]
TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
]


def start_llamacpp(model, port: int, log_path) -> subprocess.Popen:
    """``python -m llama_cpp.server`` on 127.0.0.1:port, returned once it answers /v1/models."""
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", "local", "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "2048", "--n_threads", str(LLM_THREADS)]  # fmt: skip
    return start_server("llama_cpp.server", cmd, port, log_path, wait_s=180)


def qwen():
    try:
        return resolve_model("bundled:qwen2.5-coder-0.5b")
    except BundledModelError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    proc = start_llamacpp(qwen(), port, tmp_path_factory.mktemp("llama_server") / "server.log")
    yield {"base_url": f"http://127.0.0.1:{port}/v1", "proc": proc}
    stop_server(proc)


def server_llm(base_url: str) -> LLMConfig:
    return LLMConfig(
        backend="openai",
        openai=OpenAIConfig(base_url=base_url, model="local", send_grammar=True, extra_body={"repeat_penalty": 1.0}, max_concurrency=2, timeout_s=120),
    )


def test_grammar_through_the_server(server):
    with OpenAIBackend(server_llm(server["base_url"])) as b:
        outs = b.complete([Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3) for t in TEXTS])
    for o in outs:
        assert o.error is None
        assert re.fullmatch(answer_regex(3), o.text), o.text
        assert len(parse_answers(o.text, 3)) == 3
        assert o.prompt_tokens > 50 and o.completion_tokens > 5


def test_runner_through_the_server_then_without_it(server, tmp_path):
    run = RunDir(str(tmp_path))
    llm = server_llm(server["base_url"])
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(TEXTS)]
    first = run_requests(reqs, llm, run, "labels", progress=False)
    assert all(r.ok for r in first)
    # the ledger answers a rerun even with the endpoint gone
    gone = LLMConfig(**{**llm.model_dump(), "openai": {**llm.openai.model_dump(), "base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 0}})
    second = run_requests(reqs, gone, run, "labels", progress=False)
    assert all(r.cached for r in second)
    assert [r.answers for r in second] == [r.answers for r in first]


def test_runner_rides_out_a_real_server_that_hangs_and_then_dies(tmp_path):
    """SIGSTOP the server (requests time out), SIGCONT it, then SIGKILL it and start it again on the same port:
    the stage finishes, every request answered once in the ledger, nothing finished asked again."""
    import signal
    import threading

    from cqg_ray.llm.ledger import Ledger

    model, port, log_path = qwen(), free_port(), tmp_path / "server.log"
    proc = start_llamacpp(model, port, log_path)
    run = RunDir(str(tmp_path / "run"))
    base = f"http://127.0.0.1:{port}/v1"
    llm = LLMConfig(
        backend="openai",
        openai=OpenAIConfig(base_url=base, model="local", send_grammar=True, extra_body={"repeat_penalty": 1.0}, max_concurrency=1, timeout_s=4,
                            max_retries=10, backoff_s=0.5),
    )
    texts = [f"{t} (note {i})" for i in range(4) for t in TEXTS]
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(texts)]
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(res=run_requests(reqs, llm, run, "labels", progress=False)), daemon=True)
    ledger = Ledger(run, "labels")

    def wait_rows(n: int, timeout: float = 180.0) -> int:
        t0 = time.time()
        while len(ledger.load()) < n:
            assert worker.is_alive() or len(ledger.load()) >= n, "runner ended early"
            assert time.time() - t0 < timeout, f"fewer than {n} rows after {timeout} s"
            time.sleep(0.1)
        return len(ledger.load())

    try:
        worker.start()
        wait_rows(2)
        proc.send_signal(signal.SIGSTOP)  # hangs: the connection is accepted, no reply comes
        time.sleep(6)  # > timeout_s: the request in flight times out and is retried
        proc.send_signal(signal.SIGCONT)
        before_kill = wait_rows(4)
        proc.kill()  # dies: connections are refused until it is back
        proc.wait()
        time.sleep(1.5)
        proc = start_llamacpp(model, port, log_path)
        worker.join(timeout=600)
        assert not worker.is_alive()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop_server(proc)
    res = out["res"]
    assert len(res) == 8 and before_kill < 8
    for r in res:
        assert r.ok and r.attempts == 1 and len(r.answers) == 3, r  # HTTP retries are not answer attempts
    stats = ledger.read_stats()
    run_stats = stats["runs"][-1]
    assert run_stats["sent"] == 8 and run_stats["complete"]
    assert run_stats["http_retries"] >= 2  # at least one timeout and one refused connection
    assert run_stats["http_calls"] == 8 + run_stats["http_retries"]
    assert len(ledger.load()) == 8
    # with the server gone for good, a rerun is answered from the ledger
    gone = llm.model_copy(update={"openai": llm.openai.model_copy(update={"max_retries": 0})})
    again = run_requests(reqs, gone, run, "labels", progress=False)
    assert all(r.cached for r in again) and [r.answers for r in again] == [r.answers for r in res]


def test_single_pass_through_the_server(server, tmp_path):
    """Single-pass answers from a real OpenAI-compatible server: one token, P(yes) from its top_logprobs."""
    from cqg_ray.llm.answers import answer_requests

    llm = LLMConfig(backend="openai", openai=OpenAIConfig(base_url=server["base_url"], model="local", max_concurrency=2, timeout_s=120))
    reqs = [r for t in TEXTS for r in answer_requests(t, range(len(QUESTIONS)), QUESTIONS, "single", 20, 200)]
    res = run_requests(reqs, llm, RunDir(str(tmp_path)), "labels", progress=False)
    for r in res:
        assert r.ok and r.error is None, r
        assert len(r.p_yes) == 1 and 0.0 <= r.p_yes[0] <= 1.0 and r.answers == [r.p_yes[0] > 0.5]
        assert r.completion_tokens <= 1 and r.prompt_tokens > 50
    assert res[0].p_yes[0] > res[3].p_yes[0]  # "about a building?": the Eiffel Tower more than the recipe


def test_a_question_list_that_loops_is_closed_there_through_the_server(server):
    """A stop_on_loop request is streamed from the real server and closed at its loop; the same request asked whole
    (stop_loops: false) runs on to its end and begins with what the stream kept."""
    loop = Request([{"role": "user", "content": "Write a numbered list of 12 items. Items 1, 3, 5, 7, 9, 11 are 'Is it red?' and items 2, 4, "
                                                "6, 8, 10, 12 are 'Is it blue?'."}], max_tokens=90, stop_on_loop=True)
    llm = server_llm(server["base_url"])
    with OpenAIBackend(llm) as b:
        streamed = b.complete([loop])[0]
    with OpenAIBackend(llm.model_copy(update={"openai": llm.openai.model_copy(update={"stop_loops": False})})) as b:
        whole = b.complete([loop])[0]
    assert streamed.error is None and whole.error is None
    assert streamed.text == "1. Is it red?\n2. Is it blue?\n3. Is it red?\n4. Is it blue?\n"
    assert whole.text.startswith(streamed.text) and whole.completion_tokens > streamed.completion_tokens + 20 > 20
