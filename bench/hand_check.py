"""A person's answers beside the judge's, on a model's own faithfulness judgements (issue 44, item 6).

    python bench/hand_check.py draw RESULTS.json --active 75 --inactive 75 --out pairs.jsonl   # no judge answers in it
    # ... a person adds "answer": true/false to every line, without looking at the judge's answers ...
    python bench/hand_check.py score RESULTS.json pairs.jsonl

``RESULTS.json`` is what ``cqg-ray evaluate MODEL --tasks faithfulness`` wrote (its ``judgements``: text, question,
pool, the judge's answer). ``draw`` takes a seeded random sample of the active judgements and of the others (answered
no and cap left out together) and writes them shuffled, with the pool but without the judge's answer. ``score`` puts
the hand answers beside the judge's on the same pairs: yes precision (the yes-rate on active pairs) by hand and by the
judge, the yes-rate on the inactive pairs by each, balanced accuracy by each, and the judge's agreement with the hand
answers on yes and on no, with every disagreement. Last line: ``hand_yes_precision: X``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def judgements(results_path: str) -> list[dict]:
    """Every sampled judgement of the one model and text set in a faithfulness results.json."""
    faith = json.loads(Path(results_path).read_text())["faithfulness"]
    ((_, per),) = faith.items()
    ((_, res),) = per.items()
    return res["judgements"]


def draw(judged: list[dict], n_active: int, n_inactive: int, seed: int) -> list[dict]:
    """A seeded sample of the active judgements and of the others, shuffled; each as {text, question, pool} only."""
    rng = np.random.default_rng(seed)
    seen, unique = set(), []
    for j in judged:  # a (text, question) judged twice (in two pools of one text, never) counts once
        if (j["text"], j["question"]) not in seen:
            seen.add((j["text"], j["question"]))
            unique.append(j)
    active = [j for j in unique if j["pool"] == "active"]
    inactive = [j for j in unique if j["pool"] != "active"]
    picks = [active[i] for i in rng.choice(len(active), min(n_active, len(active)), replace=False)]
    picks += [inactive[i] for i in rng.choice(len(inactive), min(n_inactive, len(inactive)), replace=False)]
    return [{"text": picks[i]["text"], "question": picks[i]["question"], "pool": picks[i]["pool"]} for i in rng.permutation(len(picks))]


def score(judged: list[dict], hand: list[dict]) -> dict:
    """The figures of the module docstring; every hand pair must be one of the judgements and carry an answer."""
    by_pair = {(j["text"], j["question"]): j for j in judged}
    rows = []
    for h in hand:
        if "answer" not in h:
            raise ValueError(f"no hand answer for {h['question']!r} on {h['text'][:60]!r}")
        j = by_pair.get((h["text"], h["question"]))
        if j is None:
            raise ValueError(f"not a judgement of these results: {h['question']!r} on {h['text'][:60]!r}")
        rows.append((j["pool"] == "active", bool(h["answer"]), bool(j["judge_yes"]), h))
    act = np.array([r[0] for r in rows])
    hand_yes = np.array([r[1] for r in rows])
    judge_yes = np.array([r[2] for r in rows])
    rate = lambda x, mask: round(float(x[mask].mean()), 4) if mask.any() else None  # noqa: E731
    out = {"pairs": len(rows), "active": int(act.sum()), "inactive": int((~act).sum()),
           "hand_yes_precision": rate(hand_yes, act), "judge_yes_precision": rate(judge_yes, act),
           "hand_inactive_yes_rate": rate(hand_yes, ~act), "judge_inactive_yes_rate": rate(judge_yes, ~act),
           "judge_agrees_on_hand_yes": rate(judge_yes, hand_yes), "judge_agrees_on_hand_no": rate(~judge_yes, ~hand_yes),
           "agreement": rate(hand_yes == judge_yes, np.ones(len(rows), bool))}
    for who in ("hand", "judge"):
        x, y = out[f"{who}_yes_precision"], out[f"{who}_inactive_yes_rate"]
        out[f"{who}_balanced_accuracy"] = round((x + 1 - y) / 2, 4) if x is not None and y is not None else None
    out["disagreements"] = [{"text": h["text"], "question": h["question"], "pool": h["pool"], "hand": a, "judge": jy}
                            for _, a, jy, h in rows if a != jy]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("draw")
    d.add_argument("results")
    d.add_argument("--active", type=int, default=75)
    d.add_argument("--inactive", type=int, default=75)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("results")
    s.add_argument("pairs")
    s.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    judged = judgements(a.results)
    if a.cmd == "draw":
        picks = draw(judged, a.active, a.inactive, a.seed)
        Path(a.out).write_text("".join(json.dumps(p) + "\n" for p in picks))
        print(f"{a.out}: {len(picks)} pairs ({sum(p['pool'] == 'active' for p in picks)} active); add \"answer\" to each by hand")
        return
    hand = [json.loads(line) for line in Path(a.pairs).read_text().splitlines() if line.strip()]
    res = score(judged, hand)
    for d_ in res["disagreements"]:
        print(f"  [{d_['pool']}] hand {'yes' if d_['hand'] else 'no'}, judge {'yes' if d_['judge'] else 'no'}: {d_['question']} | {d_['text']}")
    for k, v in res.items():
        if k != "disagreements":
            print(f"{k}: {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(f"hand_yes_precision: {res['hand_yes_precision']}")


if __name__ == "__main__":
    main()
