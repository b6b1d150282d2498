"""Does a question's measured reliability say whether it is true of a text? Against a person's answers.

    python bench/hand_reliability.py builds/cqg-minilm-ref-20261129 bench/data/hand_pairs_weight_decay.jsonl bench/data/hand_pairs_budget_swap_lift05.jsonl

Hand files: JSONL of {text, question, answer} on the model's own questions (``bench/hand_check.py``,
``bench/budget_swap.py``); a pair in two files counts once (the last file's answer). Of the pairs the model could show
(P(yes) above its budget's floor, or tau), each score's AUC for the hand answer: the head's P(yes), the question's
held-out ``precision`` and ``select_auc`` (questions.json: agreement with the labelling LLM) and its mean P(yes) on
the training texts. 0.5 is chance. Last line: ``hand_truth_auc_question_precision: X``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cqg_ray.evaluate.faithfulness import answered_threshold  # noqa: E402
from cqg_ray.mbqa.embedder import InterpretableEmbedder  # noqa: E402


def auc(score: np.ndarray, truth: np.ndarray) -> float | None:
    """Mann-Whitney AUC of ``score`` for the True entries of ``truth`` (ties count a half); None without both kinds."""
    pos, neg = score[truth], score[~truth]
    if not len(pos) or not len(neg):
        return None
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("hand", nargs="+")
    args = ap.parse_args()
    model = InterpretableEmbedder.load(args.model)
    index = {q["text"]: i for i, q in enumerate(model.question_records)}
    answers: dict[tuple[str, str], bool] = {}
    for f in args.hand:
        for line in Path(f).read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                answers[(d["text"], d["question"])] = bool(d["answer"])
    pairs = [(t, q, a) for (t, q), a in answers.items() if q in index]
    texts = sorted({t for t, _, _ in pairs})
    row = {t: i for i, t in enumerate(texts)}
    probs = model.encode(texts, output="probs", progress=False)
    floor = answered_threshold(model.budget)
    p = np.array([probs[row[t], index[q]] for t, q, _ in pairs])
    keep = p > floor
    truth = np.array([a for _, _, a in pairs])[keep]
    qi = np.array([index[q] for _, q, _ in pairs])[keep]
    print(f"{len(pairs)} hand pairs on {args.model}'s questions; {int(keep.sum())} above P(yes) {floor:g}, {int(truth.sum())} true by hand")
    recs = model.question_records
    scores = {"the head's P(yes)": p[keep],
              "question precision": np.array([np.nan if recs[i].get("precision") is None else recs[i]["precision"] for i in qi]),
              "question select_auc": np.array([np.nan if recs[i].get("select_auc") is None else recs[i]["select_auc"] for i in qi]),
              "question mean P(yes)": np.asarray(model.mean, dtype=np.float64)[qi] if model.mean is not None else np.full(len(qi), np.nan)}
    for name, s in scores.items():
        have = ~np.isnan(s)
        a = auc(s[have], truth[have])
        print(f"{name}: AUC for the hand answer {'n/a' if a is None else f'{a:.3f}'} on {int(have.sum())} pairs "
              f"(mean {s[have & truth].mean():.3f} where true, {s[have & ~truth].mean():.3f} where false)")
    s = scores["question precision"]
    a = auc(s[~np.isnan(s)], truth[~np.isnan(s)])
    print(f"hand_truth_auc_question_precision: {'n/a' if a is None else f'{a:.4f}'}")


if __name__ == "__main__":
    main()
