"""Draw (text, question) pairs for hand answers from a model's active and inactive samples (the judge's check set).

    python bench/draw_judge_pairs.py MODEL_DIR --texts ../shared/data/sts/STSBenchmark.test.tsv --n 200 --out pairs.jsonl

The model embeds the first --max-texts distinct sentences of an STS TSV file (or the "text" of a JSONL file); half the
pairs are drawn at random from the (text, question) pairs its default output shows (active), half from those it
answers no (p at or below its floor, 0.5 without one), seeded. Written shuffled, one JSON object a line: text,
question, active, p, model; no answer: a person adds "answer" (true / false) without seeing the judge's.
Last line: ``drawn_pairs: N``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_sentences(path: str, n: int) -> list[str]:
    seen: dict[str, None] = {}
    if path.endswith(".tsv"):
        with open(path, encoding="utf-8") as f:
            for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                for k in ("sentence1", "sentence2"):
                    seen.setdefault(r[k].strip(), None)
    else:
        with open(path, encoding="utf-8") as f:
            for line in f:
                seen.setdefault(json.loads(line)["text"].strip(), None)
    return [t for t in seen if t][:n]


def main() -> None:
    import numpy as np

    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--max-texts", type=int, default=400)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = InterpretableEmbedder.load(a.model)
    texts = read_sentences(a.texts, a.max_texts)
    p = model.encode(texts, output="probs", progress=False)
    active = model.apply(p)[0].astype(bool)
    floor = model.budget.floor if getattr(model.budget, "floor", None) is not None else 0.5
    no = p <= floor
    rng = np.random.default_rng(a.seed)
    picks = []
    for mask, is_active in ((active, True), (no & ~active, False)):
        rows, cols = np.nonzero(mask)
        take = rng.choice(len(rows), size=min(a.n // 2, len(rows)), replace=False)
        picks += [(int(rows[i]), int(cols[i]), is_active) for i in take]
    rng.shuffle(picks)
    questions = [q["text"] for q in model.question_records]
    with open(a.out, "w", encoding="utf-8") as f:
        for t, q, is_active in picks:
            f.write(json.dumps({"text": texts[t], "question": questions[q], "active": is_active, "p": round(float(p[t, q]), 4),
                                "model": a.model}) + "\n")
    print(f"{len(texts)} texts, {model.m} questions: {int(active.sum())} active pairs, {int((no & ~active).sum())} answered no")
    print(f"drawn_pairs: {len(picks)}")


if __name__ == "__main__":
    main()
