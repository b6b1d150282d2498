"""Single-pass answering with the real bundled Qwen2.5-Coder-0.5B: P(yes) is exactly the full-vocabulary
probability of the same prompt, prefix reuse changes no answer, and a labelling run killed with SIGKILL resumes
without asking any finished pair again. How llama.cpp's batch engine decodes (a batch like one at a time, a shared
prefix read once) on the bundled SmolLM2-135M."""

import subprocess

import numpy as np
import pytest

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.base import Request
from cqg_ray.llm.engines.bundled import BundledModelError, resolve_model
from cqg_ray.llm.ledger import Ledger
from cqg_ray.llm.prompts import cqg_messages
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS

from .jobs import job, sigkill_after_finished

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp")

TEXTS = [
    "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
    "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
    "The striker scored twice in the second half and the home team won the cup.",
]
QUESTIONS = ["Is the text about a building?", "Does the text mention a year?", "Is the text a recipe?", "Does the text mention food?",
             "Is the text about sports?"]


def full_vocab_p_yes(logits: np.ndarray, yes: list[int], no: list[int]) -> float:
    x = np.asarray(logits, dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()  # softmax over the whole vocabulary, then P(yes spellings) / P(yes or no spellings)
    return float(p[yes].sum() / (p[yes].sum() + p[no].sum()))


@pytest.fixture(scope="module")
def backend():
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    try:
        resolve_model("bundled:qwen2.5-coder-0.5b")
    except BundledModelError as e:
        pytest.skip(str(e))
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(score_engine="llamacpp", generate_engine="llamacpp", n_threads=LLM_THREADS)))
    yield b
    b.close()


@pytest.fixture(scope="module")
def small_backend():
    """The bundled SmolLM2-135M on llama.cpp: for the tests of how the engine decodes (a batch against one at a time, a
    shared prefix read once), which any model shows at a quarter of the 0.5B's work."""
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    try:
        resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", score_engine="llamacpp", generate_engine="llamacpp",
                                                          n_threads=LLM_THREADS)))
    yield b
    b.close()


def requests():
    return [r for t in TEXTS for r in answer_requests(t, range(len(QUESTIONS)), QUESTIONS, "single", 20, 200)]


def test_llamacpp_p_yes_is_the_full_vocabulary_probability(backend):
    yes, no = backend.yes_no_token_sets()
    reqs = requests()[:4]
    tokens = [backend.prompt_tokens(r) for r in reqs]
    alone = backend.engine.score(tokens, yes, no, share_prefix=False)
    for t, (p, shared) in zip(tokens, alone):
        backend.model.reset()
        backend.model.eval(t)  # llama-cpp-python's own forward pass of the same tokens: its context's last logits
        want = full_vocab_p_yes(np.ctypeslib.as_array(backend.model._ctx.get_logits(), shape=(backend.model.n_vocab(),)), yes, no)
        assert abs(p - want) < 1e-3 and shared == 0


def test_a_tree_read_in_several_decode_calls_gives_the_same_answers(backend, monkeypatch):
    """Scoring reads a prefix tree in calls of ``score_step`` tokens (progress advances between them): 37 a call
    reads these trees in several and gives the answers of one call each."""
    yes, no = backend.yes_no_token_sets()
    tokens = [backend.prompt_tokens(r) for r in requests()]
    whole = backend.engine.score(tokens, yes, no)
    monkeypatch.setattr(backend.engine, "score_step", 37)
    split = backend.engine.score(tokens, yes, no)
    assert max(len(t) for t in tokens) > 37 * 2
    assert [s for _, s in split] == [s for _, s in whole]  # the same tree
    assert [p > 0.5 for p, _ in split] == [p > 0.5 for p, _ in whole]
    # llama.cpp's quantised kernels differ by batch shape only (0.013 at most here, measured): the prefix-reuse bound
    assert max(abs(a - b) for (a, _), (b, _) in zip(split, whole)) < 0.03


def test_llamacpp_prefix_reuse_gives_the_same_answers(backend):
    reqs = requests()
    shared = backend.score(reqs)
    alone = backend.score(reqs, share_prefix=False)
    assert [c.p_yes[0] > 0.5 for c in shared] == [c.p_yes[0] > 0.5 for c in alone]
    assert max(abs(a.p_yes[0] - b.p_yes[0]) for a, b in zip(shared, alone)) < 0.03  # kernels differ by batch shape only
    assert all(c.error is None and c.prompt_tokens > 60 for c in shared)
    # the instruction is computed once per tree, each text once for its five questions
    computed = sum(c.prompt_tokens - c.cached_tokens for c in shared)
    assert computed < 0.4 * sum(c.prompt_tokens for c in shared)
    assert [c.cached_tokens for c in alone] == [0] * len(reqs)


def test_torch_engine_p_yes_is_the_full_vocabulary_probability(backend):
    torch = pytest.importorskip("torch")
    from cqg_ray.llm.engines.bundled import hf_folder
    from cqg_ray.llm.engines.torch_engine import TorchEngine

    scorer = TorchEngine(hf_folder("bundled:qwen2.5-coder-0.5b"), dtype="float32", n_threads=LLM_THREADS)
    yes, no = backend.yes_no_token_sets()
    tokens = [backend.prompt_tokens(r) for r in requests()]
    tree = scorer.score(tokens, yes, no)
    with torch.inference_mode():
        for t, (p, _) in zip(tokens, tree):
            logits = scorer.model(input_ids=torch.tensor([t])).logits[0, -1].numpy()
            assert abs(p - full_vocab_p_yes(logits, yes, no)) < 1e-3
    assert sum(s for _, s in tree) > 0.6 * sum(len(t) for t in tokens)  # most tokens came from the tree's shared prefixes
    # the two engines read the same answers from the same model (GGUF in llama.cpp, its weights dequantised in torch)
    ll = backend.engine.score(tokens, yes, no)
    assert np.mean([(a > 0.5) == (b > 0.5) for (a, _), (b, _) in zip(tree, ll)]) >= 0.9
    scorer.close()


def test_batched_generation_decodes_like_one_at_a_time(small_backend):
    backend = small_backend
    reqs = [Request(cqg_messages([t], [u], n_questions=3), max_tokens=60) for t in TEXTS for u in TEXTS if u != t][:4]
    batched = dict(backend.generate_batched(reqs))
    one = [backend.complete_one(r) for r in reqs]
    assert sorted(batched) == list(range(len(reqs)))
    for i, o in enumerate(one):
        assert batched[i].error is None and batched[i].prompt_tokens == o.prompt_tokens
        assert 0 < batched[i].completion_tokens <= 60 and batched[i].text.strip()
    # greedy in both; batched matrix shapes may round differently, so replies can part after a few tokens
    assert sum(batched[i].text == one[i].text for i in range(len(reqs))) >= 1
    # one sequence through the engine is the same computation as create_chat_completion: identical replies
    for i in range(2):
        (_, toks), = list(backend.engine.generate([backend.prompt_tokens(reqs[i])], [60]))
        assert backend.model.detokenize(toks).decode("utf-8", errors="ignore") == one[i].text


def test_generation_reads_the_prompts_common_prefix_once(small_backend):
    """Property prompts share ~600 tokens (chat template, rules, worked examples): read once into the prefix's own
    sequence and copied into each slot, the rest read per prompt; the replies are those of reading every prompt whole
    (the same greedy tokens: only the prefix's last chunk is read in another shape), and one prompt shares nothing."""
    backend = small_backend
    from cqg_ray import progress
    from cqg_ray.llm.engines.batch import MIN_SHARED_PREFIX, common_prefix
    from cqg_ray.llm.prompts import property_messages

    tokens = [backend.prompt_tokens(Request(property_messages([t], [u], n_questions=3), max_tokens=16))
              for t, u in zip(TEXTS, TEXTS[1:] + TEXTS[:1])]
    shared = min(common_prefix(tokens[0], t) for t in tokens[1:])
    assert shared > 500 and all(len(t) > shared for t in tokens)
    engine = backend.generator
    before = progress.snapshot().get("read", 0)
    once = dict(engine.generate(tokens, [16] * len(tokens)))
    assert progress.snapshot()["read"] - before == shared + sum(len(t) - shared for t in tokens)
    before = progress.snapshot()["read"]
    whole = dict(engine.generate(tokens, [16] * len(tokens), share_prefix=False))
    assert progress.snapshot()["read"] - before == sum(len(t) for t in tokens)
    assert sorted(once) == sorted(whole) == list(range(len(tokens))) and all(once.values())
    # greedy both ways; the prefix's last chunk is read in another shape, so a near-tie may part a reply (measured with
    # the 0.5B on 5 such prompts: 4 identical over 24 tokens, the fifth another sensible list; an empty or unshared cache
    # parts all)
    assert sum(once[i] == whole[i] for i in range(len(tokens))) >= 2
    # more prompts than slots: a slot taking its next prompt gets the prefix copied again, with the same replies; a
    # prompt counts as handed (and its own tokens as planned) when it takes a slot, not while it waits in the queue
    engine_seqs, engine.gen_seqs = engine.gen_seqs, 2
    assert len(tokens) > 2
    try:
        c0, again, handed_at_first = progress.snapshot(), {}, None
        for i, out in engine.generate(tokens, [16] * len(tokens)):
            again[i] = out
            c = progress.snapshot()
            handed_at_first = c["handed"] - c0["handed"] if handed_at_first is None else handed_at_first
    finally:
        engine.gen_seqs = engine_seqs
    c = progress.snapshot()
    assert handed_at_first == 2 and c["handed"] - c0["handed"] == len(tokens)
    assert c["planned"] - c0["planned"] == shared + sum(len(t) - shared for t in tokens)
    assert sum(again[i] == once[i] for i in range(len(tokens))) >= 2
    before = progress.snapshot()["read"]
    list(engine.generate([tokens[0][:40]], [1]))  # one prompt: nothing to share
    assert progress.snapshot()["read"] - before == 40 and MIN_SHARED_PREFIX == 16


def test_the_generation_context_is_made_to_what_a_call_needs_and_grows(small_backend):
    """The generation context is made on first use to the call's sequences (and the shared prefix's own) at a multiple
    of GEN_CTX_STEP tokens each, made again larger only for a call that needs more, reused by one that needs less; the
    greedy replies are token for token those of the context of gen_seqs + 1 sequences of n_ctx made up front."""
    from cqg_ray.llm.engines.batch import GEN_CTX_STEP
    from cqg_ray.llm.prompts import property_messages

    engine = small_backend.generator
    lc = engine.lc
    tokens = [small_backend.prompt_tokens(Request(property_messages([t], [u], n_questions=3), max_tokens=16))
              for t, u in zip(TEXTS, TEXTS[1:] + TEXTS[:1])]
    assert len(tokens) >= 3 and max(len(t) for t in tokens) + 16 <= GEN_CTX_STEP * 2 < engine.gen_ctx_per_seq
    if engine._gen_ctx is not None:
        lc.llama_free(engine._gen_ctx)
        engine._gen_ctx = None

    def shape():
        seqs = lc.llama_n_seq_max(engine._gen_ctx)
        return seqs, lc.llama_n_ctx(engine._gen_ctx) // seqs

    short = dict(engine.generate([tokens[0][:40]], [4]))
    assert shape() == (2, GEN_CTX_STEP)  # one slot and the prefix's sequence, one step each
    sized = dict(engine.generate(tokens, [16] * len(tokens)))
    per = -(-(max(len(t) for t in tokens) + 16) // GEN_CTX_STEP) * GEN_CTX_STEP
    assert shape() == (min(engine.gen_seqs, len(tokens)) + 1, per)
    again = dict(engine.generate([tokens[0][:40]], [4]))  # needs less: the same context
    assert shape() == (min(engine.gen_seqs, len(tokens)) + 1, per) and again == short
    lc.llama_free(engine._gen_ctx)
    engine._gen_ctx = engine._context(engine.gen_ctx_per_seq * (engine.gen_seqs + 1), engine.gen_seqs + 1, unified=False)
    assert shape() == (engine.gen_seqs + 1, engine.gen_ctx_per_seq)
    assert dict(engine.generate(tokens, [16] * len(tokens))) == sized and dict(engine.generate([tokens[0][:40]], [4])) == short


def test_sigkill_during_single_pass_labelling_repeats_no_finished_pair(tmp_path):
    try:
        resolve_model("bundled:qwen2.5-coder-0.5b")
    except BundledModelError as e:
        pytest.skip(str(e))
    run_dir = str(tmp_path / "run")
    cmd, env = job("single_pass_job.py", run_dir)
    ledger = Ledger(RunDir(run_dir), "labels")
    sigkill_after_finished(cmd, env, ledger, 8, timeout=300)  # two batches of four finished, then killed wherever it is
    finished = ledger.load()
    assert ledger.shards() == [] and 8 <= len(finished) < 40
    before = {k: v["finished_at"] for k, v in finished.items()}

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:3] == ["DONE", "40", str(len(finished))]
    rows = Ledger(RunDir(run_dir), "labels").load()
    assert len(rows) == 40 and all(r["ok"] and len(r["p_yes"]) == 1 for r in rows.values())
    assert {k: rows[k]["finished_at"] for k in before} == before  # finished pairs were not asked again
    last = Ledger(RunDir(run_dir), "labels").read_stats()["runs"][-1]
    assert last["to_send"] == last["sent"] == 40 - len(finished) and last["complete"]
