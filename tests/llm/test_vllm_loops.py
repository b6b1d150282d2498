"""vLLM's loop stop, its plain-Python part (no vllm needed): which rows stop, which requests ask, which token ends them."""

from types import SimpleNamespace

from cqg_ray.llm.engines import vllm_loops
from cqg_ray.llm.engines.vllm_loops import newline_ids, stop_token, stopping_rows, update_rows, wants_stop

VOCAB = ["1. Is it red?", "\n", "2. Is it blue?", "3. Is it red?", "4. Is it blue?", "?\n", "5. Is it green", " and", "<eos>"]


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def test_newline_ids_are_the_tokens_whose_text_holds_a_newline():
    assert newline_ids(decode, len(VOCAB)) == frozenset({1, 5})


def test_a_row_stops_at_the_newline_after_its_second_repeat():
    newlines = newline_ids(decode, len(VOCAB))
    looped = [0, 1, 2, 1, 3, 1, 4, 1]  # 1. red, 2. blue, 3. red, 4. blue: two repeats in a row, then a newline
    rows = {0: looped, 2: looped[:-1], 3: looped[:6], 5: [0, 1, 2, 1, 6, 5], 6: [], 7: [*looped[:-1], -1]}
    # 2: the fourth item not yet complete; 3: one repeat only; 5: a new question; 6: nothing yet; 7: a placeholder
    # (async scheduling) where the newline will be
    assert stopping_rows(rows, newlines, decode) == [0]
    seen = []
    assert stopping_rows({1: [0, 1, 2, 7], 4: looped}, newlines, lambda ids: seen.append(ids) or decode(ids)) == [4]
    assert seen == [looped]  # a reply is decoded only after a newline token


def test_which_requests_ask_and_which_token_ends_them():
    asked = SimpleNamespace(extra_args={"cqg_stop_on_loop": True}, eos_token_id=8, all_stop_token_ids={8, 3})
    assert wants_stop(asked) and stop_token(asked) == 8
    assert not wants_stop(SimpleNamespace(extra_args={"cqg_stop_on_loop": False}))  # shared_shape's filler in a mixed job
    assert not wants_stop(SimpleNamespace(extra_args=None)) and not wants_stop(SimpleNamespace(extra_args={"other": 1}))
    assert stop_token(SimpleNamespace(eos_token_id=None, all_stop_token_ids={7, 3})) == 3
    assert stop_token(SimpleNamespace(eos_token_id=None, all_stop_token_ids=set())) is None
    assert stop_token(SimpleNamespace(ignore_eos=True, eos_token_id=8, all_stop_token_ids={8})) is None


def test_the_engine_finds_the_processor_by_this_name():
    assert vllm_loops.PROCESSOR == "cqg_ray.llm.engines.vllm_loops:LoopStop"


def test_rows_follow_the_batch_as_vllm_adds_removes_and_moves_requests():
    from enum import Enum

    Move = Enum("MoveDirectionality", "UNIDIRECTIONAL SWAP")  # vLLM's, by name
    asked, other = SimpleNamespace(extra_args={"cqg_stop_on_loop": True}), SimpleNamespace(extra_args=None)
    track = lambda params, prompt, output: output if wants_stop(params) else None  # noqa: E731
    rows = {}
    update_rows(rows, SimpleNamespace(added=[(0, asked, None, ["a"]), (1, other, None, ["b"]), (2, asked, None, ["c"])], removed=[], moved=[]), track)
    assert rows == {0: ["a"], 2: ["c"]}
    update_rows(rows, SimpleNamespace(added=[(0, other, None, ["d"])], removed=[1], moved=[(2, 1, Move.UNIDIRECTIONAL)]), track)
    assert rows == {1: ["c"]}  # 0 reused by a request that does not ask; 2 moved into the hole at 1
    update_rows(rows, SimpleNamespace(added=[(0, asked, None, ["e"])], removed=[], moved=[(0, 1, Move.SWAP)]), track)
    assert rows == {1: ["e"], 0: ["c"]}
    update_rows(rows, None, track)  # no change to the batch this step
    assert rows == {1: ["e"], 0: ["c"]}
