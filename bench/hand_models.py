"""Two models by hand, blind: the questions each shows on the same texts, answered by a person who does not know which
model showed them.

    python bench/hand_models.py draw cqg-minilm-ref runs/reference/model TEXTS --each 40 --out pairs.jsonl
    # ... a person adds "answer": true/false to every line, without knowing which model showed it ...
    python bench/hand_models.py score cqg-minilm-ref runs/reference/model TEXTS pairs.jsonl

TEXTS: a faithfulness ``results.json`` (its judged texts, in order: the same texts a judge saw) or a ``.jsonl`` of
{"text": ...} lines. Each model shows the questions of its own default budget. ``draw`` takes a seeded sample of
``--each`` shown (text, question) pairs of each model, merges them (a pair both drew is asked once) and writes them
shuffled as {text, question} alone. ``score`` (with draw's ``--each`` and ``--seed``) draws the same samples again and
gives each model's yes precision by hand over its own sample (standard error beside it) and the change from A to B; a
drawn pair this machine's model no longer shows (a probability at the floor may fall on the other side on another CPU)
is left out and said.
Last line: ``hand_models_precision_change: X``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_texts(path: str) -> list[str]:
    """A faithfulness results.json's judged texts in order, or the texts of a .jsonl."""
    if path.endswith(".json"):
        faith = json.loads(Path(path).read_text())["faithfulness"]
        ((_, per),) = faith.items()
        ((_, res),) = per.items()
        return list(dict.fromkeys(j["text"] for j in res["judgements"]))
    return [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]


def shown(model_name: str, texts: list[str]) -> set[tuple[int, str]]:
    """(text row, question text) of every pair the model's default budget shows on ``texts``."""
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    model = InterpretableEmbedder.load(model_name)
    mask, _ = model.apply(model.encode(texts, output="probs", progress=False))
    rows, cols = np.nonzero(np.asarray(mask))
    return {(int(r), model.questions[c]) for r, c in zip(rows, cols)}


def sample(pairs: set[tuple[int, str]], each: int, rng: np.random.Generator) -> list[tuple[int, str]]:
    ordered = sorted(pairs)
    return [ordered[i] for i in sorted(rng.choice(len(ordered), min(each, len(ordered)), replace=False))]


def precision(answers: list[bool]) -> tuple[float, float]:
    p = float(np.mean(answers))
    return p, float(np.sqrt(p * (1 - p) / len(answers)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["draw", "score"])
    ap.add_argument("model_a")
    ap.add_argument("model_b")
    ap.add_argument("texts", help="a faithfulness results.json or a .jsonl of {\"text\": ...}")
    ap.add_argument("pairs", nargs="?", help="score: the answered pairs")
    ap.add_argument("--each", type=int, default=40, help="draw: shown pairs sampled of each model")
    ap.add_argument("--seed", type=int, default=93)
    ap.add_argument("--out", help="draw: where to write the pairs")
    ap.add_argument("--json", help="score: write the figures here too")
    args = ap.parse_args()
    texts = read_texts(args.texts)
    a, b = shown(args.model_a, texts), shown(args.model_b, texts)
    print(f"{len(texts)} texts; A shows {len(a)} pairs, B {len(b)}; both {len(a & b)}")
    rng = np.random.default_rng(args.seed)
    picks_a, picks_b = sample(a, args.each, rng), sample(b, args.each, rng)
    if args.command == "draw":
        merged = sorted(set(picks_a) | set(picks_b))
        merged = [merged[i] for i in rng.permutation(len(merged))]
        Path(args.out).write_text("".join(json.dumps({"text": texts[r], "question": q}) + "\n" for r, q in merged))
        print(f"wrote {len(merged)} pairs to {args.out} ({len(picks_a)} of A's, {len(picks_b)} of B's, {len(picks_a) + len(picks_b) - len(merged)} "
              "drawn by both): answer each (\"answer\": true/false) without the models in view")
        return
    hand = {(h["text"], h["question"]): bool(h["answer"]) for h in map(json.loads, Path(args.pairs).read_text().splitlines()) if "answer" in h}
    out = {}
    for name, picks, shows in (("A", picks_a, a), ("B", picks_b, b)):
        got = [hand[(texts[r], q)] for r, q in picks if (texts[r], q) in hand and (r, q) in shows]
        if len(got) < len(picks):
            print(f"note: {len(picks) - len(got)} of {name}'s {len(picks)} drawn pairs have no answer here or are not shown here: left out")
        if not got:
            raise SystemExit(f"none of {name}'s drawn pairs is answered: score the file `draw` wrote, with the same models, texts, --each and --seed")
        out[name] = (*precision(got), sum(got), len(got))
        print(f"{name} ({getattr(args, 'model_' + name.lower())}): true by hand {out[name][2]} of {out[name][3]}: yes precision "
              f"{out[name][0]:.3f} (standard error {out[name][1]:.3f})")
    diff = out["B"][0] - out["A"][0]
    print(f"yes precision from A to B: {diff:+.4f} (standard error at most {np.hypot(out['A'][1], out['B'][1]):.4f}; the pairs both drew are shared)")
    if args.json:
        Path(args.json).write_text(json.dumps({"texts": args.texts, "pairs": args.pairs, "each": args.each, "seed": args.seed, **{
            name: {"model": getattr(args, "model_" + name.lower()), "shown": len(shows), "true": out[name][2], "answered": out[name][3],
                   "yes_precision": round(out[name][0], 4), "standard_error": round(out[name][1], 4)}
            for name, shows in (("A", a), ("B", b))}, "precision_change": round(diff, 4)}, indent=1) + "\n")
    print(f"hand_models_precision_change: {diff:.4f}")


if __name__ == "__main__":
    main()
