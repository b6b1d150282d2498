"""The prompt-length guard: prompts counted in the engine's tokens, clipped or trimmed to fit, never sent too long."""

import pytest

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.base import Request
from cqg_ray.llm.engines.fake import FakeBackend
from cqg_ray.llm.engines.fake import fake_budget
from cqg_ray.llm.fit import PromptFitter, PromptTooLong
from cqg_ray.llm.prompts import cqg_messages

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def text(i: int, chars: int) -> str:
    words, n = [], 0
    while n < chars:
        w = WORDS[(i + len(words)) % len(WORDS)]
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:chars]


def cqg_build(max_tokens=400):
    return lambda pos, neg: Request(cqg_messages(pos, neg, 10), max_tokens=max_tokens, meta={"cluster": 7})


def fake(n_ctx):
    return FakeBackend(LLMConfig(backend="fake"), n_ctx=n_ctx).prompt_budget()


def test_a_prompt_that_fits_is_returned_untouched():
    b = fake(4096)
    f = PromptFitter(b, "cqg-generate")
    pos, neg = [text(i, 100) for i in range(6)], [text(i, 100) for i in range(6, 42)]
    req, p, n = f.contrast(pos, neg, cqg_build(), "cluster 7")
    assert req.messages == cqg_messages(pos, neg, 10) and p == pos and n == neg
    # over the byte bound (~5.7k bytes against 3,696 tokens left), so it was counted exactly: 1,420 fake tokens
    assert f.report() == {"prompts_checked": 1, "prompts_clipped": 0, "texts_dropped": 0, "chars_cut": 0, "longest_prompt_tokens": b.count(req)}
    assert b.count(req) == 1420
    # under the byte bound: checked, not tokenized, so no longest prompt is known (it was written as 0 tokens)
    f = PromptFitter(b, "cqg-generate")
    f.contrast(pos[:2], neg[:2], cqg_build(), "cluster 8")
    assert f.report() == {"prompts_checked": 1, "prompts_clipped": 0, "texts_dropped": 0, "chars_cut": 0, "longest_prompt_tokens": None}


def test_an_over_long_cqg_prompt_is_clipped_to_the_longest_common_length_that_fits():
    b = fake(4096)
    pos, neg = [text(i, 1000) for i in range(6)], [text(i, 1000) for i in range(6, 42)]
    before = b.count(cqg_build()(pos, neg))
    assert before > 4096  # 42 texts of 1,000 characters: ~11k fake tokens
    f = PromptFitter(b, "cqg-generate")
    req, p, n = f.contrast(pos, neg, cqg_build(), "cluster 7")
    assert len(p) == 6 and len(n) == 36  # clipping was enough: nothing dropped
    assert b.count(req) <= 4096 - 400
    cap = max(map(len, p + n))
    longer = cqg_build()([t[: cap + 8] for t in pos], [t[: cap + 8] for t in neg])
    assert b.count(longer) > 4096 - 400  # a few characters more would not fit: the cap is as long as it can be
    cut = sum(map(len, pos + neg)) - sum(map(len, p + n))
    assert f.counts == {"checked": 1, "clipped": 1, "texts_dropped": 0, "chars_cut": cut, "max_tokens_before": before}


def test_a_cqg_prompt_drops_negatives_first_when_clipping_is_not_enough():
    b = fake(1400)  # at 200 characters each 42 texts need ~2.5k tokens; 1,000 are left for the prompt
    pos, neg = [text(i, 1000) for i in range(6)], [text(i, 1000) for i in range(6, 42)]
    f = PromptFitter(b, "cqg-generate")
    req, p, n = f.contrast(pos, neg, cqg_build(), "cluster 7")
    assert b.count(req) <= 1000
    assert all(len(t) <= 200 for t in p + n)
    assert len(p) == 6 and 1 <= len(n) < 36  # negatives were dropped, positives kept
    assert n == [t[: len(x)] for t, x in zip(neg, n)] and [len(x) <= 200 for x in n]
    assert f.counts["texts_dropped"] == 36 - len(n)
    # one text fewer dropped would not fit
    more = cqg_build()(p, [*n, neg[len(n)][:200].rstrip()])
    assert b.count(more) > 1000


def test_a_prompt_that_cannot_fit_names_the_stage_the_request_and_the_numbers():
    b = fake(600)
    pos, neg = [text(i, 1000) for i in range(6)], [text(i, 1000) for i in range(6, 42)]
    with pytest.raises(PromptTooLong) as e:
        PromptFitter(b, "cqg-generate").contrast(pos, neg, cqg_build(), "cluster 7")
    msg = str(e.value)
    assert msg.startswith("cqg-generate: the prompt of cluster 7 needs ")
    assert "with 1 positive and 1 negative text(s) clipped to 200 characters" in msg
    assert "the context holds 600 tokens and the reply may take 400, leaving 200 for the prompt" in msg
    assert "llm.llamacpp.n_ctx" in msg


@pytest.mark.parametrize("mode", ["single", "packed"])
def test_an_over_long_labelling_text_is_clipped(mode):
    b = fake(1024)
    questions = [f"Is the text about topic number {i}?" for i in range(30)]
    long_text = text(0, 20_000)
    build = lambda t: answer_requests(t, list(range(30)), questions, mode, 20, 200, meta={"doc_id": "d"})  # noqa: E731
    f = PromptFitter(b, "labels")
    reqs = f.text(long_text, build, "text d")
    assert len(reqs) == (30 if mode == "single" else 2)
    assert all(b.count(r) <= 1024 - r.max_tokens for r in reqs)
    kept = len(long_text) - f.counts["chars_cut"]
    assert 1000 < kept < 20_000 and f.counts["clipped"] == len(reqs)
    assert all(long_text[:kept] in r.messages[0]["content"] for r in reqs)  # the text's start, the same in every request
    again = build(long_text[: kept + 10])
    assert any(b.count(r) > 1024 - r.max_tokens for r in again)  # clipped no more than needed
    short = build("A short text.")
    assert PromptFitter(b, "labels").text("A short text.", build, "text e")[0].messages == short[0].messages


def test_a_labelling_prompt_too_long_without_its_text_is_an_error():
    b = fake(260)
    questions = ["Is " + "very " * 300 + "long?"]
    build = lambda t: answer_requests(t, [0], questions, "single", 20, 200, meta={"doc_id": "d"})  # noqa: E731
    with pytest.raises(PromptTooLong, match=r"^labels: the prompt of text d needs .* even with its text cut to nothing"):
        PromptFitter(b, "labels").text("some text", build, "text d")


def test_no_budget_checks_nothing():
    f = PromptFitter(None, "labels")
    reqs = f.text("x" * 100_000, lambda t: [Request([{"role": "user", "content": t}], max_tokens=8)], "text d")
    assert len(reqs[0].messages[0]["content"]) == 100_000 and f.counts["checked"] == 0


def test_the_fake_budget_counts_as_the_fake_reports():
    req = Request(cqg_messages([text(1, 300)], [text(2, 300)], 10), max_tokens=100)
    reported = FakeBackend(LLMConfig(backend="fake"), reply=lambda r: "1. Is it?").complete([req])[0].prompt_tokens
    assert fake_budget(LLMConfig(backend="fake")).count(req) == reported


# ----------------------------------------------------------------------------------------- the embedded engine's tokenizer


@pytest.fixture(scope="module")
def qwen_budget():
    pytest.importorskip("llama_cpp")
    from cqg_ray.llm.engines.bundled import MODELS, BundledModelError, part_paths
    from cqg_ray.llm.backends import prompt_budget

    try:
        part_paths(MODELS["qwen2.5-coder-0.5b"])
    except BundledModelError as e:
        pytest.skip(str(e))
    # an engine on llama.cpp: the budget counts with llama.cpp's tokenizer (`auto` alone gives torch on both kinds of
    # work where bfloat16 is native, and then the Hugging Face tokenizer: the next test)
    return prompt_budget(LLMConfig(backend="llamacpp", llamacpp=LlamaCppConfig(model="bundled:qwen2.5-coder-0.5b", n_ctx=4096,
                                                                              generate_engine="llamacpp")))


SKY = Request([{"role": "user", "content": "Is the sky blue?"}], max_tokens=8)


def sky_tokens() -> list[int]:
    """llama.cpp's tokens of SKY under the Qwen chat template, written out."""
    from llama_cpp import Llama

    from cqg_ray.llm.engines.bundled import resolve_model

    model = Llama(model_path=str(resolve_model("bundled:qwen2.5-coder-0.5b", None)), vocab_only=True, verbose=False)
    return model.tokenize(b"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                          b"<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n", add_bos=False, special=True)


def test_embedded_tokenizer_counts_the_templated_prompt(qwen_budget):
    assert qwen_budget.context == 4096 and qwen_budget.exact
    assert qwen_budget.engine == "llama.cpp tokenizer of bundled:qwen2.5-coder-0.5b"
    assert qwen_budget.count(SKY) == len(sky_tokens())


def test_torch_engines_budget_counts_with_the_hugging_face_tokenizer_the_same(qwen_budget):
    """Both engines on torch: the budget reads the Hugging Face tokenizer saved beside the dequantised weights (no
    llama.cpp), and counts what llama.cpp's counts."""
    from cqg_ray.llm.backends import prompt_budget
    from cqg_ray.llm.engines.bundled import hf_folder_path

    if not (hf_folder_path("bundled:qwen2.5-coder-0.5b") / "config.json").exists():
        pytest.skip("the 0.5B is not dequantised here (scripts/test.sh's set-up makes it)")
    cfg = LlamaCppConfig(model="bundled:qwen2.5-coder-0.5b", n_ctx=4096, generate_engine="torch-float32", score_engine="torch-float32")
    budget = prompt_budget(LLMConfig(backend="llamacpp", llamacpp=cfg))
    assert budget.context == 4096 and budget.exact
    assert budget.engine == "Hugging Face tokenizer of bundled:qwen2.5-coder-0.5b"
    assert budget.count(SKY) == len(sky_tokens()) == qwen_budget.count(SKY)


def test_the_byte_bound_is_an_upper_bound_of_the_real_count(qwen_budget):
    samples = ["", "plain English words " * 50, "数据 科学 与 机器 学习 " * 40, "emoji 🎉🚀 and accents é à ü " * 30, "x" * 3000, "<|im_end|> " * 20]
    for s in samples:
        req = Request([{"role": "user", "content": s}], max_tokens=1, yes_no=True, answer_prefix="1.")
        assert qwen_budget.count(req) <= qwen_budget.bound(req)


def test_embedded_tokenizer_guards_a_crafted_cqg_prompt(qwen_budget):
    pos, neg = [text(i, 1000) for i in range(6)], [text(i, 1000) for i in range(6, 42)]
    f = PromptFitter(qwen_budget, "cqg-generate")
    req, p, n = f.contrast(pos, neg, cqg_build(), "cluster 7")
    n_tokens = qwen_budget.count(req)
    assert f.counts["max_tokens_before"] > 4096 and n_tokens <= 4096 - 400
    assert len(p) == 6 and len(n) == 36 and f.counts["clipped"] == 1


def test_embedded_tokenizer_guards_a_crafted_labelling_prompt(qwen_budget):
    questions = ["Does the text discuss a neurological condition?"]
    build = lambda t: answer_requests(t, [0], questions, "single", 20, 200, meta={"doc_id": "d"})  # noqa: E731
    f = PromptFitter(qwen_budget, "labels")
    long_text = text(3, 30_000)
    reqs = f.text(long_text, build, "text d")
    kept = len(long_text) - f.counts["chars_cut"]
    assert qwen_budget.count(reqs[0]) <= 4096 - 1 < qwen_budget.count(build(long_text[: kept + 20])[0])
    assert f.counts["clipped"] == 1 and 0 < kept < 30_000 and f.counts["max_tokens_before"] > 4096


# ----------------------------------------------------------------------------------------- an OpenAI-compatible server


def test_openai_server_context_and_tokenize_route():
    from cqg_ray.config import OpenAIConfig
    from cqg_ray.llm.backends import prompt_budget
    from tests.llm.fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer(max_model_len=1024) as srv:
        llm = LLMConfig(backend="openai", openai=OpenAIConfig(base_url=srv.base_url, model="local"))
        b = prompt_budget(llm)
        assert b.context == 1024 and b.engine.endswith("/tokenize") and b.exact
        req = Request([{"role": "user", "content": "y" * 8000}], max_tokens=200)
        assert b.count(req) == 8000 // 4 + 10
        reqs = PromptFitter(b, "labels").text("y" * 8000, lambda t: [Request([{"role": "user", "content": t}], max_tokens=200)], "text d")
        assert b.count(reqs[0]) <= 1024 - 200 and srv.tokenize_calls > 2
        assert srv.requests == []  # counting sends no chat completion
        # the config's context wins over the server's
        assert prompt_budget(llm.model_copy(update={"openai": llm.openai.model_copy(update={"max_model_len": 2048})})).context == 2048


def test_openai_server_without_routes():
    from cqg_ray.config import OpenAIConfig
    from cqg_ray.llm.backends import prompt_budget
    from tests.llm.fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as srv:
        llm = LLMConfig(backend="openai", openai=OpenAIConfig(base_url=srv.base_url, model="local"))
        assert prompt_budget(llm) is None  # context unknown: not checked (the stage logs a warning)
        b = prompt_budget(llm.model_copy(update={"openai": llm.openai.model_copy(update={"max_model_len": 512})}))
        assert b.context == 512 and not b.exact and "UTF-8 bytes" in b.engine
        assert b.count(Request([{"role": "user", "content": "é" * 10}], max_tokens=1)) == 64 + 20


def test_the_embedded_and_vllm_budgets_are_built_once_per_process_and_config(monkeypatch):
    """Each task or actor of a streaming stage asks for the budget; a tokenizer loads once per process and config (an
    OpenAI-compatible server's budget is asked for anew)."""
    from cqg_ray.config import OpenAIConfig, VLLMConfig
    from cqg_ray.llm import backends

    built = []
    monkeypatch.setitem(backends.BUDGETS, "vllm", lambda llm: built.append(llm.vllm.max_model_len) or object())
    monkeypatch.setitem(backends.BUDGETS, "openai", lambda llm: built.append("openai") or object())
    backends._kept_budget.cache_clear()
    try:
        a = LLMConfig(backend="vllm", vllm=VLLMConfig(model="m", max_model_len=1024))
        assert backends.prompt_budget(a) is backends.prompt_budget(LLMConfig.model_validate_json(a.model_dump_json()))
        b = a.model_copy(update={"vllm": a.vllm.model_copy(update={"max_model_len": 2048})})
        assert backends.prompt_budget(b) is not backends.prompt_budget(a)
        o = LLMConfig(backend="openai", openai=OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="x"))
        assert backends.prompt_budget(o) is not backends.prompt_budget(o)
        assert built == [1024, 2048, "openai", "openai"]
    finally:
        backends._kept_budget.cache_clear()
