"""bench/judge_check.py on a scripted judge (no model): agreement apart for yes and for no on the pooled held-out
property parts, the threshold chosen on the choosing parts only, yes-precision by hand and by the judge."""

import json
from pathlib import Path

import pytest

from cqg_ray.llm.base import Completion
from tests.scripts import load_script

judge_check = load_script("bench/judge_check.py", "bench_judge_check")


class Scripted:
    """P(yes) per (prompt kind, question): the judge prompt says 0.9 to "Is it red?" and 0.3 to the rest; the
    labelling prompt 0.7 to everything; the prompt with worked examples 0.4 to "Is it red?", 0.2 to the rest."""

    def complete(self, reqs):
        out = []
        for r in reqs:
            red = "Is it red?" in r.messages[-1]["content"]
            shots = len(r.messages) > 1
            p = 0.7 if r.answer_prefix else (0.4 if red else 0.2) if shots else (0.9 if red else 0.3)
            out.append(Completion(text="", p_yes=[p]))
        return out


def write(path: Path, rows: list[tuple[str, bool, bool]]) -> str:
    path.write_text("".join(json.dumps({"text": "a text", "question": q, "answer": a, "active": act}) + "\n" for q, a, act in rows))
    return str(path)


def test_held_out_agreement_apart_for_yes_and_no_and_a_threshold_chosen_elsewhere(tmp_path):
    # choosing part: "Is it red?" is true (yes), "Is it blue?" is not; the held-out part has one red that is false
    choose = write(tmp_path / "judge_pairs_scifact.jsonl", [("Is it red?", True, True), ("Is it red?", True, False), ("Is it blue?", False, True)])
    held = write(tmp_path / "judge_pairs_scifact_holdout.jsonl",
                 [("Is it red?", True, True), ("Is it red?", False, True), ("Is it blue?", False, False), ("Is it blue?", False, True)])
    other = write(tmp_path / "judge_pairs.jsonl", [("Is it blue?", False, True)])
    lines: list[str] = []
    res = judge_check.check(Scripted(), [choose, held, other], log=lines.append)
    # the plain judge prompt on the held-out part: yes to both reds (1 of 1 yes right), no to both blues, yes to the
    # false red: 2 of 3 no right; the default (with worked examples) says no to all at 0.5
    assert res["held_out"]["prompts"]["judge"]["at_0.5"] == {"agreement_yes": 1.0, "agreement_no": 0.6667}
    assert (res["agreement_yes"], res["agreement_no"]) == (0.0, 1.0)
    assert res["hand_pairs_property"] == 7 and res["hand_yes_property"] == 3  # the non-property set is not counted
    assert res["held_out"]["pairs"] == 4 and res["held_out"]["yes"] == 1
    # the labelling prompt says 0.7 to all: at 0.5 every answer is yes; the threshold chosen on the choosing part cannot
    # separate them either, so it stays the best balanced accuracy's nearest to 0.5 (0.5)
    lab = res["held_out"]["prompts"]["labelling"]
    assert lab["at_0.5"] == {"agreement_yes": 1.0, "agreement_no": 0.0} and lab["threshold_chosen"] == 0.5
    # worked examples: 0.4 for red, 0.2 for blue: at 0.5 all no; the threshold chosen on the choosing part (0.2:
    # P(yes) > 0.2 says yes to red only) separates them on the held-out part too
    shots = res["held_out"]["prompts"]["judge_shots"]
    assert shots["at_0.5"] == {"agreement_yes": 0.0, "agreement_no": 1.0}
    assert shots["threshold_chosen"] == 0.2 and shots["at_threshold"] == {"agreement_yes": 1.0, "agreement_no": 0.6667}
    # yes-precision of the model's active pairs (5 in the property sets, 2 of them yes by hand; the default judge says no)
    assert res["yes_precision_property"] == {"by_hand": 0.4, "by_judge": 0.0, "active_pairs": 5}
    assert res["pooled"] == {"judge": 0.875, "labelling": 0.375, "judge_shots": 0.625, "mean": 0.875}
    # several answers: the mean P(yes) is 2/3 for red (0.9, 0.7, 0.4) and 0.4 for blue (0.3, 0.7, 0.2)
    assert res["held_out"]["prompts"]["mean"]["at_0.5"] == {"agreement_yes": 1.0, "agreement_no": 0.6667}
    assert any(line.startswith("   wrong: 'a text' / 'Is it red?': written yes, P(yes) 0.4") for line in lines)  # the default's


def test_a_pair_without_an_answer_is_refused(tmp_path):
    bad = tmp_path / "judge_pairs_property.jsonl"
    bad.write_text(json.dumps({"text": "t", "question": "q?"}) + "\n")
    with pytest.raises(SystemExit, match="every line needs text, question"):
        judge_check.check(Scripted(), [str(bad)], log=lambda s: None)
