"""bench/budget_swap.py: the draw is seeded and balanced, the change of precision is the stratified estimate."""

import json
from pathlib import Path

import numpy as np
import pytest
from tests.scripts import load_script

bs = load_script("bench/budget_swap.py", "bench_budget_swap")
# the model these budgets were measured on (the heads of 2026-11-29, budget top 12 above 0.6): docs/reference-model.md
MEASURED = str(Path(__file__).resolve().parents[2] / "builds" / "cqg-minilm-ref-20261129")


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
    got, questions, a, b, (ba, bb) = bs.sides(MEASURED, str(path), [], ["floor=0.5"], b_max_mean=0.6)
    same, _, a0, b0, _ = bs.sides(MEASURED, str(path), [], ["floor=0.5"])
    model = bs.InterpretableEmbedder.load(MEASURED)
    common, probs = model.mean > 0.6, model.encode(texts, output="probs", progress=False)
    assert got == same == texts and len(questions) == len(model.mean) and (ba.floor, bb.floor) == (0.6, 0.5)
    assert (a == a0).all() and a[:, common].any() and not b[:, common].any()
    # the slots freed go to the other questions above the floor, up to 12
    assert b.sum(1).tolist() == np.minimum(12, ((probs > 0.5) & ~common).sum(1)).tolist() and (b0 & ~common <= b).all()


def test_score_finds_each_pairs_side_here_and_leaves_out_one_on_neither(tmp_path, monkeypatch, capsys):
    """score re-drew the sample and refused the file when a probability at the edge moved one pair on another CPU."""
    texts = [f"{t} number {i}." for i in range(4) for t in ("A man is playing a guitar", "Two dogs run on the beach")]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"faithfulness": {"M": {"STS-B": {"judgements": [{"text": t} for t in texts]}}}}))
    got, questions, a, b, _ = bs.sides(MEASURED, str(path), [], ["floor=0.5"], b_max_mean=0.6)
    pairs = [(r, q, "a") for r, q in zip(*np.nonzero(a & ~b))][:6] + [(r, q, "b") for r, q in zip(*np.nonzero(b & ~a))][:6]
    assert len(pairs) == 12
    both = next(zip(*np.nonzero(a & b)))  # on neither swapped side here, as a pair that moved would be
    hand = [{"text": got[r], "question": questions[q], "answer": s == "a"} for r, q, s in pairs[:12]]
    hand.append({"text": got[both[0]], "question": questions[both[1]], "answer": True})
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(h) + "\n" for h in hand))
    argv = ["budget_swap.py", "score", MEASURED, str(path), str(tmp_path / "pairs.jsonl"), "--b", "floor=0.5", "--b-max-mean", "0.6"]
    monkeypatch.setattr("sys.argv", argv)
    bs.main()
    out = capsys.readouterr().out
    assert "note: 1 of 13 answered pairs are on neither side here (a probability at the edge): left out" in out
    assert "true by hand: A only 6 of 6 (1.000), B only 0 of 6 (0.000)" in out
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(h) + "\n" for h in hand + [hand[12]] * 2))  # a fifth on neither side
    with pytest.raises(SystemExit, match="3 of 15 pairs are shown by both budgets or neither here"):
        bs.main()
