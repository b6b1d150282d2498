"""The embedded llama.cpp backend with the real bundled Qwen2.5-Coder-0.5B: format and parsing, not accuracy."""

import dataclasses
import re

import pytest

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.backends import make_backend
from cqg_ray.llm.base import Request, answer_regex
from cqg_ray.llm.engines.bundled import MODELS, BundledModelError, part_paths
from cqg_ray.llm.parse import parse_answers, parse_questions
from cqg_ray.llm.prompts import answer_messages, cqg_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")

TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
]
QUESTIONS = [
    "Is the text about a building?",
    "Does the text mention a year?",
    "Is the text a recipe?",
    "Does the text mention food?",
    "Is the text about sports?",
]


def qwen_config(**kw) -> LLMConfig:
    try:
        part_paths(MODELS["qwen2.5-coder-0.5b"])
    except BundledModelError as e:
        pytest.skip(str(e))
    return LLMConfig(backend="llamacpp", llamacpp=LlamaCppConfig(model="bundled:qwen2.5-coder-0.5b", n_ctx=2048, n_threads=LLM_THREADS), **kw)


@pytest.fixture(scope="module")
def qwen():
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    b = LlamaCppBackend(qwen_config(logprobs=True))
    yield b
    b.close()


def test_constrained_answers_have_the_exact_format_and_p_yes(qwen):
    reqs = [Request(answer_messages(t, QUESTIONS), max_tokens=60, n_answers=5) for t in TEXTS]
    outs = qwen.complete(reqs)
    for o in outs:
        assert o.error is None
        assert re.fullmatch(answer_regex(5), o.text), o.text
        answers = parse_answers(o.text, 5)
        assert o.prompt_tokens > 100
        assert o.completion_tokens >= 15  # "1", ".", " yes", "\n" ... per line, give or take merges
        assert o.p_yes is not None and len(o.p_yes) == 5
        assert all(p is not None and 0.0 <= p <= 1.0 for p in o.p_yes)
        # greedy decoding under the grammar picks the likelier of yes/no, so P(yes) agrees with the answer
        # (P(yes) also counts "Yes"/" YES"..., which the grammar forbids: a near-tie may go either way)
        clear = [(p > 0.5, a) for p, a in zip(o.p_yes, answers) if abs(p - 0.5) > 0.02]
        assert all(x == a for x, a in clear)


def test_question_generation_gives_a_numbered_list(qwen):
    msgs = cqg_messages(
        ["Whales use echolocation to hunt.", "Dolphins use clicks to find fish."],
        ["Sharks smell blood from far away.", "Eagles see prey from high above.", "Deer eat leaves and grass."],
        n_questions=2,
    )
    out = qwen.complete([Request(msgs, max_tokens=60)])[0]
    qs = parse_questions(out.text)
    assert len(qs) >= 1, out.text
    assert all(q.endswith("?") for q in qs)


def test_prompt_longer_than_the_context_is_a_row_error():
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    llm = qwen_config()
    llm.llamacpp.n_ctx = 256
    b = LlamaCppBackend(llm)
    try:
        out = b.complete([Request(answer_messages("word " * 400, QUESTIONS), max_tokens=60, n_answers=5)])[0]
    finally:
        b.close()
    assert out.text == ""
    assert out.error.startswith("llama.cpp: ")


def test_runner_with_the_embedded_model_resumes(qwen, tmp_path):
    run = RunDir(str(tmp_path))
    llm = qwen.llm
    reqs = [Request(answer_messages(t, QUESTIONS[:3]), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(TEXTS)]
    first = run_requests(reqs, llm, run, "labels", backend=qwen, progress=False)
    assert all(r.ok and len(r.answers) == 3 and len(r.p_yes) == 3 for r in first)
    second = run_requests(reqs, llm, run, "labels", backend=qwen, progress=False)
    assert all(r.cached for r in second)
    assert [r.answers for r in second] == [r.answers for r in first]


def test_actor_pool_in_ray(ray_local):
    try:
        part_paths(MODELS["smollm2-135m"])
    except BundledModelError as e:
        pytest.skip(str(e))
    from cqg_ray.llm.engines.llamacpp_pool import LlamaCppActorPool

    llm = LLMConfig(backend="llamacpp", llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", n_ctx=1024, n_threads=1, num_actors=1))
    pool = make_backend(llm)
    assert isinstance(pool, LlamaCppActorPool)
    try:
        reqs = [Request(answer_messages(t, QUESTIONS[:2]), max_tokens=20, n_answers=2) for t in TEXTS * 3]
        # single-pass requests too (scored in batches inside the actor's streaming generator)
        single = [r for t in TEXTS for r in answer_requests(t, [0, 1], QUESTIONS, mode="single", per_prompt=1, max_tokens=1)]
        got = dict(pool.stream(reqs + single))
    finally:
        pool.close()
    assert sorted(got) == list(range(6 + len(single)))
    assert all(re.fullmatch(answer_regex(2), got[i].text) for i in range(6))
    assert len(single) == 2 * len(TEXTS)
    for i in range(6, 6 + len(single)):
        c = got[i]
        assert c.error is None and c.completion_tokens == 0 and len(c.p_yes) == 1 and 0.0 <= c.p_yes[0] <= 1.0
        assert c.text == ("yes" if c.p_yes[0] > 0.5 else "no")


def test_actor_pool_streams_each_result_as_it_finishes(ray_local):
    """A chunk of generations is minutes of work: its results reach the caller (and the ledger) one by one."""
    try:
        part_paths(MODELS["smollm2-135m"])
    except BundledModelError as e:
        pytest.skip(str(e))
    from cqg_ray.llm.engines.llamacpp_pool import LlamaCppActorPool

    llm = LLMConfig(backend="llamacpp", constrained=False,
                    llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", n_ctx=1024, n_threads=1, num_actors=1, batch_generate=2))
    pool = make_backend(llm)
    assert isinstance(pool, LlamaCppActorPool)
    long = Request([{"role": "user", "content": "Count from 1 to 60, separated by commas."}], max_tokens=60)
    short = Request([{"role": "user", "content": "Say hi."}], max_tokens=1)
    try:
        assert pool.chunks([long, short]) == [[0, 1]]  # one chunk, decoded together
        order = [(i, c.completion_tokens) for i, c in pool.stream([long, short])]
    finally:
        pool.close()
    assert order[0] == (1, 1)  # the one-token answer arrives before the long one ends
    assert order[1][0] == 0 and order[1][1] > 10


LOOPING = [{"role": "user", "content": "Write a numbered list of 12 items. Items 1, 3, 5, 7, 9, 11 are 'Is it red?' and items 2, 4, 6, 8, 10, "
                                       "12 are 'Is it blue?'."}]


@pytest.mark.parametrize("engine", ["llamacpp", "torch-float32"])
def test_a_question_list_that_loops_stops_at_its_second_repeat(engine):
    """A ``stop_on_loop`` reply ends at the newline after two items in a row that repeat earlier ones, on both
    engines that decode generation prompts in batches; a request without it decodes to its end as before (one at a
    time: the next test)."""
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    cfg = qwen_config()
    b = LlamaCppBackend(cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"generate_engine": engine, "batch_generate": 4})}))
    try:
        other = Request(cqg_messages([TEXTS[0]], [TEXTS[1]], n_questions=2), max_tokens=40, stop_on_loop=True)
        free, stopped, plain = (dict(b.generate_batched(reqs)) for reqs in ([Request(LOOPING, max_tokens=90)],
                                                                             [Request(LOOPING, max_tokens=90, stop_on_loop=True), other],
                                                                             [dataclasses.replace(other, stop_on_loop=False)]))
    finally:
        b.close()
    assert stopped[0].text == "1. Is it red?\n2. Is it blue?\n3. Is it red?\n4. Is it blue?\n"
    assert list(parse_questions(stopped[0].text)) == ["Is it red?", "Is it blue?"]
    assert free[0].text.startswith(stopped[0].text) and free[0].completion_tokens > stopped[0].completion_tokens + 20
    assert stopped[1].text == plain[0].text and stopped[1].completion_tokens == plain[0].completion_tokens  # no loop: decoded as before


def test_a_list_that_loops_stops_one_at_a_time_too():
    """llama.cpp's one-at-a-time ``create_chat_completion`` (batch_generate 1, a retry at a temperature) streams a
    ``stop_on_loop`` reply and closes the stream where it loops: the same text as the batched engines stop at, the
    prompt's tokens as the unstreamed reply's usage counts them."""
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    cfg = qwen_config()
    b = LlamaCppBackend(cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"generate_engine": "llamacpp", "batch_generate": 1})}))
    try:
        free, stopped = (b.complete_one(Request(LOOPING, max_tokens=90, stop_on_loop=stop)) for stop in (False, True))
    finally:
        b.close()
    assert stopped.error is None and stopped.text == "1. Is it red?\n2. Is it blue?\n3. Is it red?\n4. Is it blue?\n"
    assert free.text.startswith(stopped.text) and free.completion_tokens > stopped.completion_tokens + 20
    assert stopped.prompt_tokens == free.prompt_tokens and 20 <= stopped.completion_tokens <= 26
