"""bench/hand_check.py: the draw hides the judge's answers, the score puts hand answers beside them exactly."""

import json

import pytest
from tests.scripts import load_script

hc = load_script("bench/hand_check.py", "bench_hand_check")


def results(tmp_path):
    judged = [{"text": f"t{i}", "question": f"q{i}", "pool": pool, "judge_yes": yes, "p": 0.7, "active": pool == "active"}
              for i, (pool, yes) in enumerate([("active", True), ("active", True), ("active", False), ("active", True),
                                               ("no", False), ("no", True), ("cap", True), ("no", False)])]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"faithfulness": {"M": {"STS-B": {"judgements": judged}}}}))
    return str(path), judged


def test_draw_is_seeded_shuffled_and_hides_the_judge(tmp_path):
    path, judged = results(tmp_path)
    picks = hc.draw(hc.judgements(path), 3, 2, seed=1)
    assert picks == hc.draw(hc.judgements(path), 3, 2, seed=1)
    assert sum(p["pool"] == "active" for p in picks) == 3 and len(picks) == 5
    assert all(set(p) == {"text", "question", "pool"} for p in picks)
    assert len(hc.draw(judged, 10, 10, seed=0)) == 8  # at most what there is


def test_score_by_hand(tmp_path):
    path, judged = results(tmp_path)
    # hand: yes to t0 and t3 of the active ones (the judge said yes to t0, t1, t3), yes to t6 (cap; the judge too)
    hand = [{"text": j["text"], "question": j["question"], "pool": j["pool"], "answer": j["text"] in ("t0", "t3", "t6")} for j in judged]
    res = hc.score(hc.judgements(path), hand)
    assert (res["pairs"], res["active"], res["inactive"]) == (8, 4, 4)
    assert res["hand_yes_precision"] == 0.5 and res["judge_yes_precision"] == 0.75
    assert res["hand_inactive_yes_rate"] == 0.25 and res["judge_inactive_yes_rate"] == 0.5
    assert res["hand_balanced_accuracy"] == 0.625 and res["judge_balanced_accuracy"] == 0.625
    assert res["judge_agrees_on_hand_yes"] == 1.0 and res["judge_agrees_on_hand_no"] == 0.6 and res["agreement"] == 0.75
    assert [(d["text"], d["hand"], d["judge"]) for d in res["disagreements"]] == [("t1", False, True), ("t5", False, True)]
    with pytest.raises(ValueError, match="no hand answer"):
        hc.score(judged, [{"text": "t0", "question": "q0", "pool": "active"}])
    with pytest.raises(ValueError, match="not a judgement"):
        hc.score(judged, [{"text": "t0", "question": "other", "pool": "active", "answer": True}])
