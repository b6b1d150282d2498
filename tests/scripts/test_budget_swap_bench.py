"""bench/budget_swap.py: the draw is seeded and balanced, the change of precision is the stratified estimate."""

import json

import numpy as np
import pytest
from tests.scripts import load_script

bs = load_script("bench/budget_swap.py", "bench_budget_swap")


def test_judged_texts_in_order_once(tmp_path):
    judged = [{"text": t} for t in ("b", "a", "b", "c", "a")]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"faithfulness": {"M": {"STS-B": {"judgements": judged}}}}))
    assert bs.judged_texts(str(path)) == ["b", "a", "c"]


def test_draw_takes_each_side_seeded_and_shuffled():
    only_a = np.zeros((4, 5), bool)
    only_b = np.zeros((4, 5), bool)
    only_a[0, 1] = only_a[2, 3] = only_a[3, 0] = True
    only_b[1, 4] = only_b[2, 2] = True
    picks = bs.draw(only_a, only_b, 2, seed=7)
    assert picks == bs.draw(only_a, only_b, 2, seed=7)
    assert sorted(s for _, _, s in picks) == ["a", "a", "b", "b"]
    assert all(only_a[r, q] for r, q, s in picks if s == "a") and {(r, q) for r, q, s in picks if s == "b"} == {(1, 4), (2, 2)}
    assert len(bs.draw(only_a, only_b, 10, seed=0)) == 5  # at most what there is


def test_change_is_the_difference_of_the_swapped_pairs_over_the_shown():
    # 100 shown by each; 20 only by A, 3 of 6 sampled true; 20 only by B, 1 of 4 true: (20 * 0.25 - 20 * 0.5) / 100
    res = bs.change(100, 20, 20, [True, True, True, False, False, False], [True, False, False, False])
    assert res["precision_change"] == -0.05 and (res["true_share_a_only"], res["true_share_b_only"]) == (0.5, 0.25)
    se = np.sqrt(0.2**2 * 0.25 / 6 + 0.2**2 * 0.1875 / 4)
    assert res["standard_error"] == pytest.approx(round(float(se), 4))


def test_b_max_mean_leaves_the_common_questions_out_of_b(tmp_path):
    texts = ["A man is playing a guitar.", "Aspirin lowers the risk of heart attack.", "Two dogs run on the beach."]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"faithfulness": {"M": {"STS-B": {"judgements": [{"text": t} for t in texts]}}}}))
    got, questions, a, b, (ba, bb) = bs.sides("cqg-minilm-ref", str(path), [], ["floor=0.5"], b_max_mean=0.6)
    same, _, a0, b0, _ = bs.sides("cqg-minilm-ref", str(path), [], ["floor=0.5"])
    model = bs.InterpretableEmbedder.load("cqg-minilm-ref")
    common, probs = model.mean > 0.6, model.encode(texts, output="probs", progress=False)
    assert got == same == texts and len(questions) == len(model.mean) and (ba.floor, bb.floor) == (0.6, 0.5)
    assert (a == a0).all() and a[:, common].any() and not b[:, common].any()
    # the slots freed go to the other questions above the floor, up to 12
    assert b.sum(1).tolist() == np.minimum(12, ((probs > 0.5) & ~common).sum(1)).tolist() and (b0 & ~common <= b).all()
