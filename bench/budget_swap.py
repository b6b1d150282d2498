"""Two budgets of one model by hand: the shown questions only one of them shows, answered by a person.

    python bench/budget_swap.py draw cqg-minilm-ref RESULTS.json --a rank=prob --b rank=lift lift=0.5 --out pairs.jsonl
    # ... a person adds "answer": true/false to every line, without knowing which budget showed it ...
    python bench/budget_swap.py score cqg-minilm-ref RESULTS.json pairs.jsonl --a rank=prob --b rank=lift lift=0.5

``RESULTS.json`` is what ``cqg-ray evaluate MODEL --tasks faithfulness`` wrote; its judged texts (in order) are the
texts. Budget A and budget B (KEY=VALUE over the model's own budget, as ``cqg-ray evaluate --budget``; with
``--b-max-mean X``, B never shows a question whose mean P(yes) on the training texts is above X) mostly show the same
(text, question) pairs; their yes precisions differ only through the pairs one shows and the other does not.
``draw`` takes a seeded sample of ``--each`` pairs that only A shows and as many that only B shows, shuffled, each as
{text, question} alone. ``score`` finds each answered pair's side as this machine computes the budgets (a pair whose
probability sits at the edge may fall on neither side on another CPU: it is left out and said), and gives each side's
true share by hand and the change of yes precision from A to B:
(B-only shown x B-only true share - A-only shown x A-only true share) / shown, with its standard error. Last line:
``budget_swap_precision_change: X``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cqg_ray.evaluate.cli import parse_budget  # noqa: E402
from cqg_ray.mbqa.budget import active_mask  # noqa: E402
from cqg_ray.mbqa.embedder import InterpretableEmbedder  # noqa: E402


def judged_texts(results_path: str) -> list[str]:
    """The texts of a faithfulness results.json (one model, one text set), in the order they were judged."""
    faith = json.loads(Path(results_path).read_text())["faithfulness"]
    ((_, per),) = faith.items()
    ((_, res),) = per.items()
    return list(dict.fromkeys(j["text"] for j in res["judgements"]))


def sides(model_name: str, results_path: str, a: list[str], b: list[str], b_max_mean: float | None = None):
    """(texts, question texts, A's mask, B's mask, the two budgets) on the results' texts; with ``b_max_mean``, B leaves
    out the questions whose training mean is above it."""
    model = InterpretableEmbedder.load(model_name)
    texts = judged_texts(results_path)
    probs = model.encode(texts, output="probs", progress=False)
    ba, bb = parse_budget(a, model.budget) if a else model.budget, parse_budget(b, model.budget)
    probs_b = probs if b_max_mean is None else np.where(model.mean <= b_max_mean, probs, 0).astype(probs.dtype)
    return texts, model.questions, active_mask(probs, ba, model.mean), active_mask(probs_b, bb, model.mean), (ba, bb)


def draw(only_a: np.ndarray, only_b: np.ndarray, each: int, seed: int) -> list[tuple[int, int, str]]:
    """(row, question, side) of a seeded sample of ``each`` A-only and ``each`` B-only pairs, shuffled."""
    rng = np.random.default_rng(seed)
    out = []
    for mask, side in ((only_a, "a"), (only_b, "b")):
        rows, cols = np.nonzero(mask)
        out += [(int(rows[i]), int(cols[i]), side) for i in rng.choice(len(rows), min(each, len(rows)), replace=False)]
    return [out[i] for i in rng.permutation(len(out))]


def change(n_shown: int, n_only_a: int, n_only_b: int, true_a: list[bool], true_b: list[bool]) -> dict:
    """The change of yes precision from A to B (both showing ``n_shown`` pairs) and its standard error, from the hand
    answers on samples of the pairs only A shows (of ``n_only_a``) and only B shows (of ``n_only_b``)."""
    ta, tb = float(np.mean(true_a)), float(np.mean(true_b))
    var = (n_only_a / n_shown) ** 2 * ta * (1 - ta) / len(true_a) + (n_only_b / n_shown) ** 2 * tb * (1 - tb) / len(true_b)
    return {"true_share_a_only": round(ta, 4), "true_share_b_only": round(tb, 4),
            "precision_change": round((n_only_b * tb - n_only_a * ta) / n_shown, 4), "standard_error": round(float(np.sqrt(var)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["draw", "score"])
    ap.add_argument("model")
    ap.add_argument("results")
    ap.add_argument("pairs", nargs="?", help="score: the answered pairs")
    ap.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="budget A over the model's own (default: its own)")
    ap.add_argument("--b", nargs="+", required=True, metavar="KEY=VALUE", help="budget B over the model's own")
    ap.add_argument("--b-max-mean", type=float, metavar="X", help="B never shows a question whose training mean is above X")
    ap.add_argument("--each", type=int, default=30)
    ap.add_argument("--seed", type=int, default=85)
    ap.add_argument("--out", help="draw: where to write the pairs")
    args = ap.parse_args()
    texts, questions, a, b, (ba, bb) = sides(args.model, args.results, args.a, args.b, args.b_max_mean)
    only_a, only_b = a & ~b, b & ~a
    b_name = bb.name + (f", no question of mean > {args.b_max_mean:g}" if args.b_max_mean is not None else "")
    print(f"{len(texts)} texts; A {ba.name}: {int(a.sum())} shown; B {b_name}: {int(b.sum())} shown; both {int((a & b).sum())}, "
          f"A only {int(only_a.sum())}, B only {int(only_b.sum())}")
    if args.command == "draw":
        picks = draw(only_a, only_b, args.each, args.seed)
        Path(args.out).write_text("".join(json.dumps({"text": texts[r], "question": questions[q]}) + "\n" for r, q, _ in picks))
        print(f"wrote {len(picks)} pairs to {args.out}: answer each (\"answer\": true/false) without the budgets in view")
        return
    hand = [json.loads(line) for line in Path(args.pairs).read_text().splitlines() if line.strip()]
    if any("answer" not in h for h in hand):
        raise SystemExit("every pair needs its answer (\"answer\": true/false)")
    side = {}  # each answered pair's side as this machine computes the two budgets
    for mask, s in ((only_a, "a"), (only_b, "b")):
        side.update({(texts[r], questions[q]): s for r, q in zip(*np.nonzero(mask))})
    gone = [h for h in hand if (h["text"], h["question"]) not in side]
    if len(gone) > len(hand) // 10:
        raise SystemExit(f"{len(gone)} of {len(hand)} pairs are shown by both budgets or neither here: they are not this draw's "
                         "(same model, results and budgets)")
    if gone:  # a P(yes) at the floor or the k-th place that this CPU's encoder puts on the other side
        print(f"note: {len(gone)} of {len(hand)} answered pairs are on neither side here (a probability at the edge): left out")
    got = {s: [bool(h["answer"]) for h in hand if side.get((h["text"], h["question"])) == s] for s in "ab"}
    res = change(int(a.sum()), int(only_a.sum()), int(only_b.sum()), got["a"], got["b"])
    if a.sum() != b.sum():
        print(f"note: A shows {int(a.sum())} and B {int(b.sum())}: the change is given over A's count")
    print(f"true by hand: A only {sum(got['a'])} of {len(got['a'])} ({res['true_share_a_only']:.3f}), "
          f"B only {sum(got['b'])} of {len(got['b'])} ({res['true_share_b_only']:.3f})")
    print(f"yes precision from A to B: {res['precision_change']:+.4f} (standard error {res['standard_error']:.4f})")
    print(f"budget_swap_precision_change: {res['precision_change']:.4f}")


if __name__ == "__main__":
    main()
