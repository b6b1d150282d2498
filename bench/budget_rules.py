"""Which load budget to ship: every rule on the same heads, side by side, on the shared STS sets and SciFact.

    python bench/budget_rules.py [--model cqg-minilm-ref] [--stats ../shared/data/corpus/sentences.jsonl.gz]

The model's probabilities are computed once per text set (STS12, STS13, STS-B test; SciFact queries and corpus);
then each rule (`cqg_ray.mbqa.budget.Budget`) is applied and scored as `cqg-ray evaluate` scores it: STS Spearman
averaged over the three sets (and its ratio to the dense encoder's), the cognitive load (questions active for both
texts of a pair, mean over STS pairs), SciFact nDCG@10 (and its ratio). Rules: the paper's tau at several tau; top-k
ranked by p or by p minus the question's mean (``--stats``: the training texts the means are measured on, never the
evaluation sets; default the model's own stats), each with floors none / 0.3 / 0.4 / 0.5 and values 0/1, p, centred;
and per-question thresholds (not a shipped rule, measured here only): active when p > mean_i + delta (and p > 0.5, or
not), centred values.

Last line: `budget_sts_ratio_at_load_50: X`, the best STS ratio among rules whose load is at most 50 whose SciFact
ratio is at least 0.60 (0 when none).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from _common import cpu_line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cqg-minilm-ref")
    ap.add_argument("--stats", default=None, help="training texts for the means (default: the model's stats.safetensors)")
    ap.add_argument("--n", type=int, default=20_000, help="texts sampled from --stats")
    ap.add_argument("--ks", nargs="+", type=int, default=[16, 32, 48, 64, 80, 96, 112, 128, 160])
    a = ap.parse_args()
    print(cpu_line(), flush=True)
    t_start = time.time()

    from cqg_ray.config import EvaluateConfig
    from cqg_ray.evaluate.metrics import cognitive_load, sts_spearman
    from cqg_ray.evaluate.tasks import load_datasets, retrieval_score
    from cqg_ray.mbqa.budget import Budget, apply_budget
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    model = InterpretableEmbedder.load(a.model)
    if a.stats:
        from cqg_ray.textfiles import load_texts, sample_indices
        from cqg_ray.mbqa.cli import mean_probabilities

        texts = load_texts(a.stats).texts
        model.mean = mean_probabilities(model, [texts[i] for i in sample_indices(len(texts), a.n, 0)])
    if model.mean is None:
        raise SystemExit(f"{a.model} has no stats.safetensors: give --stats TRAINING_TEXTS")
    mean = model.mean
    ds = load_datasets(EvaluateConfig(tasks=["sts", "retrieval"]))
    sts, ret = ds["sts"], ds["retrieval"][0]

    def embed(texts):
        E = model.encoder.encode(texts, normalize=True)
        return E, model.encode_embeddings(E, output="probs")

    sts_data = []
    for d in sts:
        texts, i1, i2 = d.unique_texts()
        sts_data.append((d, i1, i2, *embed(texts)))
    (qE, qP), (dE, dP) = embed(ret.queries), embed(ret.docs)
    dense_sts = float(np.mean([sts_spearman(E[i1], E[i2], d.scores) for d, i1, i2, E, _ in sts_data]))
    dense_ret = retrieval_score(qE, dE, ret)
    print(f"{model.m} questions; encoded in {time.time() - t_start:.0f} s; dense encoder: STS avg {dense_sts:.2f}, SciFact {dense_ret:.2f}")

    rules = [Budget(rule="tau", tau=t) for t in (0.5, 0.6, 0.7, 0.76, 0.8, 0.9)]
    rules += [Budget(rule="tau", tau=t, value=v) for t in (0.5, 0.76) for v in ("prob", "centred")]
    for rank in ("prob", "centred"):
        for floor in (None, 0.3, 0.4, 0.5):
            for value in ("one", "prob", "centred"):
                rules += [Budget(rule="top_k", k=k, floor=floor, value=value, rank=rank) for k in a.ks]
    def per_question(P, delta, floor):
        mask = (P - mean > delta) & (P > floor if floor is not None else True)
        return np.where(mask, P - mean, 0).astype(np.float32)

    extra = {f"p > mean_i + {d:g}" + (" and p > 0.5" if f is not None else "") + " centred": (d, f)
             for d in (0.1, 0.2, 0.3, 0.4) for f in (None, 0.5)}
    rows = []
    for name, (delta, floor) in extra.items():
        rho, load = [], []
        for d, i1, i2, _, P in sts_data:
            V = per_question(P, delta, floor)
            rho.append(sts_spearman(V[i1], V[i2], d.scores))
            load.append(cognitive_load(V[i1], V[i2]))
        r = retrieval_score(per_question(qP, delta, floor), per_question(dP, delta, floor), ret)
        rows.append((name, float(np.mean(rho)), float(np.mean(rho)) / dense_sts, float(np.mean(load)), r, r / dense_ret))
    for b in rules:
        rho, load = [], []
        for d, i1, i2, _, P in sts_data:
            V = apply_budget(P, b, mean)[1]
            rho.append(sts_spearman(V[i1], V[i2], d.scores))
            load.append(cognitive_load(V[i1], V[i2]))
        r = retrieval_score(apply_budget(qP, b, mean)[1], apply_budget(dP, b, mean)[1], ret)
        rows.append((b.name, float(np.mean(rho)), float(np.mean(rho)) / dense_sts, float(np.mean(load)), r, r / dense_ret))
    print("\n| rule | STS avg | / dense | load | SciFact | / dense |\n|---|---|---|---|---|---|")
    for name, s, sr, load_, r, rr in rows:
        print(f"| {name} | {s:.2f} | {sr:.3f} | {load_:.1f} | {r:.2f} | {rr:.3f} |")
    ok = [row for row in rows if row[3] <= 50 and row[5] >= 0.60]
    best = max(ok, key=lambda row: row[2]) if ok else None
    if best:
        print(f"\nbest at load <= 50 with SciFact >= 0.60 of dense: {best[0]} (STS {best[2]:.3f}, load {best[3]:.1f}, SciFact {best[5]:.3f})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; {time.time() - t_start:.0f} s")
    print(f"budget_sts_ratio_at_load_50: {best[2] if best else 0:.3f}")


if __name__ == "__main__":
    main()
