"""What a model shows for texts with nothing to say (random letters, numbers, URLs, punctuation) beside real texts.

    python bench/unlike_texts.py [--model cqg-minilm-ref] [--n 300] [--seed 0]

Sets: STS-B test sentences, SciFact abstracts (title + text), 20 Newsgroups posts (n each, seeded), and n generated
junk strings (random lower-case words of 2-8 letters, groups of digits, made-up URLs, runs of punctuation; seeded).
For each set: the median number of questions above P(yes) 0.6 and of questions the model's budget shows, and each
text's cosine to its 10 nearest of 5,000 training-corpus sentences (the frozen encoder's, mean of the 10), which says
whether anything in the embedding tells junk from a real text; a few junk texts with what they show, and the questions
most shown for junk with the share of each set's texts that show them. Blank texts (`texts.blank`) answer no to everything and are not among these.
Last line: `unlike_texts_shown_junk_vs_sts: X` (median questions the budget shows for junk / for STS-B sentences).
"""

import argparse
import csv
import gzip
import json
import os
import random
import string
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from _common import DATA, read_texts

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def junk_texts(n: int, rng: random.Random) -> list[str]:
    def words(k: int) -> str:
        return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))) for _ in range(k))

    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(words(rng.choice([1, 2, 3, 5])))
        elif kind == 1:
            out.append(" ".join(str(rng.randint(0, 99999)) for _ in range(rng.randint(1, 5))))
        elif kind == 2:
            out.append(rng.choice(["http://", "https://www."]) + words(1) + ".com/" + words(2).replace(" ", "/"))
        else:
            out.append("".join(rng.choice("!@#$%^&*()_+-=[]{};:,./<>?") for _ in range(rng.randint(1, 12))))
    return out


def real_sets(n: int, rng: random.Random) -> dict[str, list[str]]:
    with open(os.path.join(SHARED, "sts", "STSBenchmark.test.tsv"), encoding="utf-8") as f:
        sts = list(dict.fromkeys(row["sentence1"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)))
    with open(os.path.join(SHARED, "retrieval", "scifact", "corpus.jsonl"), encoding="utf-8") as f:
        sci = [(d["title"] + " " + d["text"]).strip() for d in map(json.loads, f)]
    with gzip.open(os.path.join(SHARED, "clustering", "twentynewsgroups.jsonl.gz"), "rt", encoding="utf-8") as f:
        tng = [t for t in (json.loads(line)["text"].strip() for line in f) if t]
    return {"STS-B": rng.sample(sts, n), "SciFact": rng.sample(sci, n), "20NG": rng.sample(tng, n)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cqg-minilm-ref", help="model folder or shipped name (default cqg-minilm-ref)")
    ap.add_argument("--n", type=int, default=300, help="texts a set (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.texts import blank

    t0 = time.time()
    model = InterpretableEmbedder.load(args.model)
    rng = random.Random(args.seed)
    sets = {**real_sets(args.n, rng), "junk": junk_texts(args.n, rng)}
    assert not any(blank(t) for t in sets["junk"])
    train = read_texts(DATA, 50_000, min_chars=20)
    train = rng.sample(train, 5_000)
    ref = model.encoder.encode(train, normalize=True)
    questions = [q["text"] if isinstance(q, dict) else str(q) for q in model.questions]
    print(f"model {args.model}: m={model.m}, budget {model.budget_for().name}; {args.n} texts a set, seed {args.seed}")
    print(f"{'set':<8} {'median P>0.6':>13} {'median shown':>13} {'nearest-10 cosine p5 / p50 / p95':>34}")
    shown_median, share = {}, {}
    for name, texts in sets.items():
        emb = model.encoder.encode(texts, normalize=True)
        near = np.sort(emb @ ref.T, axis=1)[:, -10:].mean(axis=1)
        probs = model.encode(texts, output="probs", progress=False).astype(np.float32)
        shown = model.encode(texts, output="bits", progress=False)
        shown_median[name] = float(np.median(shown.sum(axis=1)))
        p5, p50, p95 = np.percentile(near, [5, 50, 95])
        print(f"{name:<8} {np.median((probs > 0.6).sum(axis=1)):>13.1f} {shown_median[name]:>13.1f} {p5:>14.3f} / {p50:.3f} / {p95:.3f}")
        share[name] = shown.sum(axis=0).astype(np.int64) / len(texts)
        if name == "junk":
            print("junk texts and their surest shown question:")
            for i in range(4):  # one of each kind
                q = int(np.argmax(np.where(shown[i] > 0, probs[i], -1)))
                print(f"  {texts[i]!r:<32} {probs[i, q]:.2f} {questions[q]}" if shown[i].any() else f"  {texts[i]!r:<32} (none shown)")
    top = np.argsort(-share["junk"], kind="stable")[:6]
    print("the questions most shown for junk, and the share of each set's texts that show them:")
    print(f"  {'  '.join(f'{n:>7}' for n in sets)}")
    for q in top:
        print(f"  {'  '.join(f'{share[n][q]:>7.2f}' for n in sets)}  {questions[q]}")
    print(f"seconds: {time.time() - t0:.1f}")
    print(f"unlike_texts_shown_junk_vs_sts: {shown_median['junk'] / shown_median['STS-B']:.2f}")


if __name__ == "__main__":
    main()
