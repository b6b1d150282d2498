"""Batched greedy generation in torch (``TorchEngine.generate``) with real bundled models (SmolLM2-135M where any
model shows the property, Qwen2.5-Coder-0.5B where its replies matter): a batch decodes exactly like one prompt at
a time (float32), replies parse into questions, sequences stop at an end token or at max_tokens, and a generation
run killed with SIGKILL resumes without asking any finished prompt again."""

import subprocess

import pytest

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.base import Request
from cqg_ray.llm.engines.bundled import BundledModelError, resolve_model
from cqg_ray.llm.ledger import Ledger
from cqg_ray.llm.parse import parse_questions
from cqg_ray.llm.prompts import cqg_messages
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS

from .jobs import job, sigkill_after_finished

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")
pytest.importorskip("torch")

TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
    "The striker scored twice in the second half and the home team won the cup.",
]


@pytest.fixture(scope="module")
def backend():
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    try:
        resolve_model("bundled:qwen2.5-coder-0.5b")
    except BundledModelError as e:
        pytest.skip(str(e))
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(generate_engine="torch-float32", batch_generate=4, n_threads=LLM_THREADS)))
    yield b
    b.close()


@pytest.fixture(scope="module")
def small_backend():
    """The bundled SmolLM2-135M on the torch engine: for the tests of how the engine decodes (a batch against one at a
    time, reads in chunks, against transformers), which any model shows at a quarter of the 0.5B's work."""
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    try:
        resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", generate_engine="torch-float32", batch_generate=4,
                                                          n_threads=LLM_THREADS)))
    yield b
    b.close()


def cqg_requests(max_tokens: int) -> list[Request]:
    return [Request(cqg_messages([t], [u], n_questions=3), max_tokens=max_tokens) for t in TEXTS for u in TEXTS if u != t]


def test_torch_batched_generation_equals_one_at_a_time_in_float32(small_backend):
    engine = small_backend.generator
    assert engine.dtype_name == "float32" and engine.gen_seqs == 4
    tokens = [small_backend.prompt_tokens(r) for r in cqg_requests(16)[:4]]
    assert len({len(t) for t in tokens}) > 1  # prompts of different lengths: right-aligned in the batch cache, masked on the left
    batched = dict(engine.generate(tokens, [16] * len(tokens)))
    engine.gen_seqs = 1
    try:
        one = dict(engine.generate(tokens, [16] * len(tokens)))
    finally:
        engine.gen_seqs = 4
    assert sorted(batched) == sorted(one) == list(range(len(tokens)))
    assert [batched[i] for i in range(len(tokens))] == [one[i] for i in range(len(tokens))]  # token for token
    assert all(len(one[i]) == 16 for i in one)


def test_prompts_read_in_chunks_generate_what_one_pass_does(small_backend, monkeypatch):
    """Generation reads each prompt ``read_chunk`` tokens a pass (progress advances between them): 7 a pass decodes
    the same tokens as one pass a prompt."""
    engine = small_backend.generator
    tokens = [small_backend.prompt_tokens(r) for r in cqg_requests(12)[:4]]
    whole = dict(engine.generate(tokens, [12] * len(tokens)))
    monkeypatch.setattr(engine, "read_chunk", 7)
    chunked = dict(engine.generate(tokens, [12] * len(tokens)))
    assert min(len(t) for t in tokens) > 7 * 3
    assert [chunked[i] for i in range(len(tokens))] == [whole[i] for i in range(len(tokens))]


def test_torch_batched_generation_equals_transformers_generate_in_float32(small_backend):
    """The engine's own decoding (its attention for one query row, its preallocated cache, the shared prefix read once,
    left padding) against transformers' ``generate`` with SDPA attention on the same weights, one prompt at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    engine = small_backend.generator
    tokens = [small_backend.prompt_tokens(r) for r in cqg_requests(12)[:4]]
    ours = dict(engine.generate(tokens, [12] * len(tokens)))
    ref = AutoModelForCausalLM.from_pretrained(engine.model.name_or_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    for i, t in enumerate(tokens):
        with torch.inference_mode():
            out = ref.generate(torch.tensor([t]), max_new_tokens=12, do_sample=False, eos_token_id=engine.eos_ids, pad_token_id=engine.eos_ids[0])
        assert ours[i] == out[0, len(t) :].tolist()


def test_torch_batched_generation_in_bfloat16_stays_close():
    """bfloat16: the shared prefix read apart and the batch size change the sums, so greedy choices may part after a while; the replies
    still start alike. (Measured on the 0.5B with the bench's 32 CQG prompts: docs/answer-modes.md.) SmolLM2-135M: how the engine
    sums in bfloat16 shows on any model, at a quarter of the 0.5B's work."""
    from cqg_ray.hardware import pick_dtype
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    try:
        resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    # where bfloat16 is emulated (no AMX or AVX-512-BF16: pick_dtype chooses float32 there, so only a forced
    # generate_engine runs this), 2 of the 6 prompts in one batch (the 0.5B's 6 took 225 s of a CI run there, AVX2 EPYC)
    n = 6 if pick_dtype() == "bfloat16" else 2
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", generate_engine="torch-bfloat16", batch_generate=min(n, 4),
                                                          n_threads=LLM_THREADS)))
    try:
        tokens = [b.prompt_tokens(r) for r in cqg_requests(8)[:n]]  # the first 4 tokens are compared: 8 decode steps show them
        batched = dict(b.generator.generate(tokens, [8] * len(tokens)))
        b.generator.gen_seqs = 1
        one = dict(b.generator.generate(tokens, [8] * len(tokens)))
    finally:
        b.close()
    assert all(batched[i][:4] == one[i][:4] for i in one)


def test_generated_replies_parse_into_questions(backend):
    reqs = cqg_requests(100)[:2]
    outs = dict(backend.generate_batched(reqs))
    for i in range(len(reqs)):
        assert outs[i].error is None and 0 < outs[i].completion_tokens <= 100
        assert outs[i].prompt_tokens == len(backend.prompt_tokens(reqs[i]))
        assert len(parse_questions(outs[i].text)) >= 2, outs[i].text


def test_generation_stops_at_the_end_token_and_at_max_tokens(backend):
    eog = set(backend.eog_ids())
    assert 151645 in eog  # Qwen's <|im_end|>
    short = Request([{"role": "user", "content": "Reply with the single word OK and nothing else."}], max_tokens=50)
    capped = [Request(cqg_messages([TEXTS[0]], [TEXTS[1]]), max_tokens=n) for n in (1, 7)]
    engine = backend.generator
    out = dict(engine.generate([backend.prompt_tokens(r) for r in [short, *capped]], [50, 1, 7]))
    assert 0 < len(out[0]) < 10 and not eog & set(out[0])  # ended by <|im_end|>, which is not part of the reply
    assert backend.model.detokenize(out[0]).decode().strip().strip(".") == "OK"
    assert len(out[1]) == 1 and len(out[2]) == 7  # cut at max_tokens, each in the same batch
    assert out[2][:1] == out[1]
    with pytest.raises(ValueError, match="empty prompt"):
        list(engine.generate([[]], [5]))


def test_sigkill_during_torch_generation_repeats_no_finished_prompt(tmp_path):
    try:
        resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    run_dir = str(tmp_path / "run")
    cmd, env = job("generate_job.py", run_dir)
    ledger = Ledger(RunDir(run_dir), "questions")
    sigkill_after_finished(cmd, env, ledger, 2, timeout=600)  # the first batch of two finished, then killed wherever it is
    finished = ledger.load()
    assert ledger.shards() == [] and 2 <= len(finished) < 6
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["DONE", "6", str(len(finished))]  # every finished prompt came from the ledger
    assert len(Ledger(RunDir(run_dir), "questions").load()) == 6
