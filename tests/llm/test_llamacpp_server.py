"""The OpenAI backend against a real OpenAI-compatible server: ``python -m llama_cpp.server`` on 127.0.0.1."""

import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from cqg_ray.config import LLMConfig, OpenAIConfig
from cqg_ray.llm.base import Request, answer_regex
from cqg_ray.llm.bundled import BundledModelError, resolve_model
from cqg_ray.llm.openai import OpenAIBackend
from cqg_ray.llm.parse import parse_answers
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp.server.app")

QUESTIONS = ["Is the text about a building?", "Does the text mention a year?", "Is the text a recipe?"]
TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        model = resolve_model("bundled:qwen2.5-coder-0.5b")
    except BundledModelError as e:
        pytest.skip(str(e))
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", "local", "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "2048", "--n_threads", str(min(2, os.cpu_count() or 1))]  # fmt: skip
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    log = open(log_path, "w")  # a file, not a pipe: the server logs a lot and would block on a full pipe
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.time() - t0 > 180:
            proc.kill()
            pytest.fail(f"llama_cpp.server did not start in 180 s: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)
    yield {"base_url": base, "proc": proc}
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


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
