"""The pure parts of single-pass answering: prefix-tree grouping, tree entries and masks, P(yes) arithmetic,
single-pass requests, prompts and keys (no model, no Ray)."""

import math

import numpy as np
import pytest

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.base import Completion, Request, backend_identity, resolve_engine
from cqg_ray.llm.engines.batch import common_prefix, p_yes_from_logits, prefix_groups, tree_entries
from cqg_ray.llm.ledger import request_key
from cqg_ray.llm.parse import p_yes_from_top
from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, single_answer_prompt
from cqg_ray.llm.runner import judge
from cqg_ray.hardware import pick_dtype
from cqg_ray.llm.engines.torch_engine import tree_mask

A = [1, 2, 3, 4, 5]
B = [1, 2, 3, 6]
C = [1, 2, 7]
D = [9, 9]


def test_common_prefix():
    assert common_prefix(A, B) == 3
    assert common_prefix(A, D) == 0
    assert common_prefix(A, A) == 5


def test_prefix_groups_cut_by_seqs_and_tokens():
    assert prefix_groups([A, B, C, D], max_seqs=64, max_tokens=100) == [(0, 4)]
    assert prefix_groups([A, B, C, D], max_seqs=2, max_tokens=100) == [(0, 2), (2, 4)]
    # A costs 5, B adds 1 (6), C adds 1 (7), D adds 2 (9): a limit of 7 closes the group before D
    assert prefix_groups([A, B, C, D], max_seqs=64, max_tokens=7) == [(0, 3), (3, 4)]
    assert prefix_groups([A, B], max_seqs=1, max_tokens=100) == [(0, 1), (1, 2)]


def test_tree_entries_evaluate_every_tree_token_once():
    entries, last, shared = tree_entries([A, B, C])
    assert shared == [0, 3, 2]
    assert [(t, p) for t, p, _, _ in entries] == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (6, 3), (7, 2)]
    assert [s for _, _, s, _ in entries] == [[0, 1, 2], [0, 1, 2], [0, 1], [0], [0], [1], [2]]
    assert [w for _, _, _, w in entries] == [False, False, False, False, True, True, True]
    assert last == [4, 5, 6]


def test_tree_entries_keep_a_last_token_per_prompt():
    entries, last, shared = tree_entries([[1, 2], [1, 2]])  # identical prompts: the second still reads its own last token
    assert shared == [0, 1]
    assert [(t, p, s) for t, p, s, _ in entries] == [(1, 0, [0, 1]), (2, 1, [0]), (2, 1, [1])]
    assert last == [1, 2]


def test_tree_mask_is_each_tokens_path_from_the_root():
    entries, _, shared = tree_entries([A, B, C])
    mask = tree_mask([A, B, C], shared, len(entries))
    expected = np.array([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],  # B's 6 sees 1 2 3 and itself
        [1, 1, 0, 0, 0, 0, 1],  # C's 7 sees 1 2 and itself
    ], dtype=bool)
    assert (mask == expected).all()


def test_p_yes_from_logits_is_a_softmax_over_the_two_answers():
    logits = np.array([0.0, math.log(3.0), math.log(1.0), 5.0])  # yes spellings 1 and 2 (3 + 1), no spelling 0 (1)
    assert p_yes_from_logits(logits, [1, 2], [0]) == pytest.approx(0.8, abs=1e-12)
    assert p_yes_from_logits(np.array([-1e4, 0.0]), [0], [1]) == pytest.approx(0.0, abs=1e-12)


def test_p_yes_from_top_logprobs():
    assert p_yes_from_top([(" yes", math.log(0.6), {" no": math.log(0.2), "Yes": math.log(0.1)})]) == pytest.approx(0.7 / 0.9)
    assert p_yes_from_top([("No", math.log(0.9), {"The": math.log(0.05)})]) == 0.0
    assert p_yes_from_top([("The", 0.0, {})]) is None
    assert p_yes_from_top([]) is None


def test_single_pass_requests_and_their_prompt():
    reqs = answer_requests("A cat sat.", [2, 0], ["Q0?", "Q1?", "Q2?"], "single", 20, 200, meta={"doc_id": "d"})
    assert [r.meta for r in reqs] == [{"doc_id": "d", "question_ids": [2]}, {"doc_id": "d", "question_ids": [0]}]
    assert all(r.yes_no and r.max_tokens == 1 and r.n_answers is None and r.answer_prefix == SINGLE_ANSWER_PREFIX for r in reqs)
    assert reqs[0].messages == [{"role": "user", "content": single_answer_prompt("A cat sat.", "Q2?")}]
    prompt = single_answer_prompt("A cat sat.", "Q2?")
    assert prompt.startswith("Evaluate the following text chunk")
    assert prompt.endswith("Text Chunk:\nA cat sat.\n\nQuestions:\n1. Q2?")
    packed = answer_requests("A cat sat.", [2, 0, 1], ["Q0?", "Q1?", "Q2?"], "packed", 2, 200)
    assert [(r.n_answers, r.meta["question_ids"]) for r in packed] == [(2, [2, 0]), (1, [1])]
    with pytest.raises(ValueError, match="answer mode"):
        answer_requests("t", [0], ["Q?"], "twice", 20, 200)


def test_single_pass_request_validation_and_key():
    with pytest.raises(ValueError, match="either single-pass"):
        Request([{"role": "user", "content": "x"}], 1, n_answers=2, yes_no=True).validate()
    with pytest.raises(ValueError, match="answer_prefix"):
        Request([{"role": "user", "content": "x"}], 1, answer_prefix="1.").validate()
    ident = {"backend": "llamacpp", "model": "m", "score_engine": "llamacpp"}
    msg = [{"role": "user", "content": "x"}]
    single = Request(msg, 1, yes_no=True, answer_prefix="1.")
    assert request_key(ident, single) != request_key({**ident, "score_engine": "torch-bfloat16"}, single)
    plain = Request(msg, 1)  # the single-pass engine does not key other requests
    assert request_key(ident, plain) == request_key({k: v for k, v in ident.items() if k != "score_engine"}, plain)
    assert request_key(ident, single) != request_key(ident, Request(msg, 1, yes_no=True, answer_prefix="A:"))
    gen_ident = {**ident, "generate_engine": "torch-bfloat16"}  # the generation engine keys generation requests only
    assert request_key(gen_ident, plain) != request_key(ident, plain)
    assert request_key(gen_ident, single) == request_key(ident, single)
    packed = Request(msg, 40, n_answers=2)
    assert request_key(gen_ident, packed) == request_key(ident, packed)


def test_engine_choice_follows_the_cpu():
    avx512_bf16 = {"avx2", "avx512f", "avx512_bf16"}  # AMD EPYC Zen 4
    amx = {"avx2", "avx512f", "amx_tile", "amx_bf16"}  # Intel Xeon (Sapphire Rapids and later)
    avx2 = {"avx2", "fma"}  # AMD EPYC Zen 2/3
    for work in ("score", "generate"):  # bfloat16 native: torch-bfloat16 for both kinds of work
        assert resolve_engine("auto", avx512_bf16, work) == resolve_engine("auto", amx, work) == "torch-bfloat16"
    # AVX2 only (measured on the demo's work, docs/llm.md): torch-float32 scores 1.50x llama.cpp, generation at par stays llama.cpp
    assert resolve_engine("auto", avx2) == resolve_engine("auto", avx2, "score") == "torch-float32"
    assert resolve_engine("auto", avx2, "generate") == "llamacpp"
    assert resolve_engine("auto", set(), "score") == resolve_engine("auto", set(), "generate") == "llamacpp"  # not measured: llama.cpp
    for flags in (avx2, set()):  # without llama-cpp-python (scripts/setup.sh without --llama-cpp): torch-float32 in its place
        assert resolve_engine("auto", flags, "score", llama_cpp=False) == resolve_engine("auto", flags, "generate", llama_cpp=False) == "torch-float32"
    assert resolve_engine("auto", avx512_bf16, "generate", llama_cpp=False) == "torch-bfloat16"
    assert resolve_engine("llamacpp", avx2, "generate", llama_cpp=False) == "llamacpp"  # named: taken as named (its load says what is missing)
    assert resolve_engine("torch-float32", avx512_bf16) == "torch-float32"  # a named engine is taken as named
    assert resolve_engine("llamacpp", avx2, "score") == "llamacpp"
    with pytest.raises(ValueError, match="score or generate"):
        resolve_engine("auto", avx2, "judge")
    ident = backend_identity(LLMConfig(llamacpp=LlamaCppConfig(generate_engine="llamacpp", score_engine="torch-float32")))
    assert ident["score_engine"] == "torch-float32" and "generate_engine" not in ident  # llama.cpp generation keys as before
    ident = backend_identity(LLMConfig(llamacpp=LlamaCppConfig(generate_engine="torch-bfloat16")))
    assert ident["generate_engine"] == "torch-bfloat16"
    with pytest.raises(ValueError):
        LlamaCppConfig(generate_engine="torch-float16")


def test_judge_single_pass():
    req = Request([{"role": "user", "content": "x"}], 1, yes_no=True)
    assert judge(req, Completion("yes", p_yes=[0.7])) == (True, [True], None)
    assert judge(req, Completion("no", p_yes=[0.2])) == (True, [False], None)
    ok, answers, err = judge(req, Completion("", p_yes=None))
    assert not ok and answers is None and "without a P(yes)" in err
    assert judge(req, Completion("", error="boom")) == (False, None, "boom")


def test_pick_dtype_by_cpu_flags():
    assert pick_dtype({"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert pick_dtype({"avx2", "amx_bf16", "amx_tile"}) == "bfloat16"
    assert pick_dtype({"avx2", "fma"}) == "float32"
    assert LLMConfig().answer_mode == "single"


def test_single_pass_requests_with_the_judges_prompt():
    from cqg_ray.llm.prompts import judge_shot_messages

    reqs = answer_requests("A cat sat.", [2, 0], ["Q0?", "Q1?", "Q2?"], "single", 20, 200, meta={"doc_id": "d"}, prompt="judge")
    assert [r.meta for r in reqs] == [{"doc_id": "d", "question_ids": [2]}, {"doc_id": "d", "question_ids": [0]}]
    assert [r.messages for r in reqs] == [judge_shot_messages("A cat sat.", "Q2?"), judge_shot_messages("A cat sat.", "Q0?")]
    assert all(r.yes_no and r.max_tokens == 1 and r.n_answers is None and r.answer_prefix == "" for r in reqs)
    assert reqs[0].messages[-1]["content"].endswith("Text: A cat sat.\n\nQuestion: Q2?") and len(reqs[0].messages) == 9
    with pytest.raises(ValueError, match="'judge' in single mode; got 'judge' in 'packed' mode"):
        answer_requests("t", [0], ["Q?"], "packed", 20, 200, prompt="judge")
    with pytest.raises(ValueError, match="got 'shots'"):
        answer_requests("t", [0], ["Q?"], "single", 20, 200, prompt="shots")
