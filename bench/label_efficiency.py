"""Label efficiency and training variants on a finished run: how good do the heads get with fewer labels per question?

    python bench/label_efficiency.py runs/reference [--fractions 0.25 0.5 0.75 1] [--variants hard soft lr1e-4]

For each fraction f of every question's training labels (the same held-out documents throughout: the train stage's
split), train the heads with `run_epochs` (the loop each Ray Train worker runs; one process, no Ray) and report the
held-out accuracy and macro F1 against the LLM's answers (the paper's Table 6) and STS-B test Spearman of the binary
embeddings at tau = 0.5. Variants at f = 1: `soft` fits P(yes) instead of 0/1 (`train.soft_labels`), `lr1e-4` the
paper's learning rate with the run's epochs. Writes label_efficiency.csv and .png beside the run's evaluation/.
Last line: held-out macro F1 at half the labels divided by macro F1 with all of them.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--variants", nargs="*", default=["soft", "lr1e-4"])
    ap.add_argument("--sts", default="../shared/data/sts/STSBenchmark.test.tsv")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch

    from cqg_ray.artifacts import load_embeddings, load_labels, load_questions
    from cqg_ray.config import load_config
    from cqg_ray.encoder import load_encoder
    from cqg_ray.evaluate.data import load_sts
    from cqg_ray.evaluate.metrics import sts_spearman
    from cqg_ray.mbqa.heads import StackedHeads
    from cqg_ray.mbqa.loop import make_optimizer, make_shards, run_epochs, steps_per_epoch
    from cqg_ray.mbqa.pairs import LabelPairs, split_holdout
    from cqg_ray.mbqa.report import classification_report, predict_pairs
    from cqg_ray.rundir import RunDir

    torch.set_num_threads(args.threads)
    run = RunDir(args.run_dir)
    cfg = load_config(run.path("config.yaml"))
    labels = load_labels(run)
    doc_ids = labels.column("doc_id").to_numpy(zero_copy_only=False)
    ids, emb = load_embeddings(run, np.unique(doc_ids))
    m = load_questions(run).num_rows  # as the train stage counts them
    columns = (np.searchsorted(ids, doc_ids), labels.column("question_id").to_numpy(),
               labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int8), m)
    train_all, test = split_holdout(LabelPairs(*columns), cfg.train.holdout, cfg.train.seed)
    p_yes = labels.column("p_yes")
    soft = None if p_yes.null_count else split_holdout(LabelPairs(*columns, p_yes.to_numpy(zero_copy_only=False)),
                                                       cfg.train.holdout, cfg.train.seed)[0]
    sts = load_sts(args.sts)
    enc = load_encoder(cfg.encode.model, backend=cfg.encode.backend, device="cpu")
    e1, e2 = enc.encode(sts.sentence1), enc.encode(sts.sentence2)
    print(f"{m} questions, {len(train_all)} training pairs ({len(train_all) / m:.1f} per question), {len(test)} held out; "
          f"STS-B {len(sts.scores)} pairs; {cfg.train.epochs} epochs at lr {cfg.train.lr:g}, K={cfg.train.pairs_per_head}", flush=True)

    def fit(train: LabelPairs, tcfg) -> StackedHeads:
        torch.manual_seed(0)
        heads = StackedHeads(emb.shape[1], m, tcfg.hidden)
        opt = make_optimizer(heads, tcfg)
        shard = make_shards(train, 1, tcfg.seed)[0]
        shard["emb"] = emb[shard["docs"]]
        run_epochs(heads, opt, shard, steps_per_epoch([shard], m, tcfg.pairs_per_head), tcfg, train.auto_pos_weight(), 0, lambda e, mt: None)
        return heads

    def score(heads: StackedHeads) -> tuple[float, float, float]:
        rep = classification_report(test.answer, (predict_pairs(heads, emb, test.doc, test.question) > 0.5).astype(np.int8))
        with torch.no_grad():
            b1 = (torch.sigmoid(heads(torch.from_numpy(e1))) > 0.5).numpy().astype(np.float32)
            b2 = (torch.sigmoid(heads(torch.from_numpy(e2))) > 0.5).numpy().astype(np.float32)
        return rep["accuracy"], rep["macro avg"]["f1-score"], sts_spearman(b1, b2, sts.scores)

    rng = np.random.default_rng(0)
    u = rng.random(len(train_all))  # a pair is kept at fraction f when u < f: smaller sets nest in larger ones
    rows = []
    for f in sorted(args.fractions):
        train = train_all.select(u < f)
        t0 = time.time()
        acc, f1, rho = score(fit(train, cfg.train))
        rows.append(("hard", f, len(train) / m, acc, f1, rho))
        print(f"hard   f={f:.2f}  {len(train) / m:6.1f} labels/question  held-out acc {acc:.3f}  "
              f"macro F1 {f1:.3f}  STS-B {rho:.2f}  ({time.time() - t0:.0f} s)", flush=True)
    for v in args.variants:
        if v == "soft":
            if soft is None:
                print("soft: the run's labels have no P(yes); skipped")
                continue
            tcfg, train = cfg.train.model_copy(update={"soft_labels": True}), soft
        elif v.startswith("lr"):
            tcfg, train = cfg.train.model_copy(update={"lr": float(v[2:])}), train_all
        else:
            raise SystemExit(f"unknown variant {v!r}")
        acc, f1, rho = score(fit(train, tcfg))
        rows.append((v, 1.0, len(train) / m, acc, f1, rho))
        print(f"{v:6s} f=1.00  {len(train) / m:6.1f} labels/question  held-out acc {acc:.3f}  macro F1 {f1:.3f}  STS-B {rho:.2f}", flush=True)

    out = run.path("evaluation")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "label_efficiency.csv"), "w") as fh:
        fh.write("variant,fraction,labels_per_question,heldout_accuracy,heldout_macro_f1,stsb_spearman\n")
        for r in rows:
            fh.write(f"{r[0]},{r[1]},{r[2]:.2f},{r[3]:.4f},{r[4]:.4f},{r[5]:.2f}\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hard = [r for r in rows if r[0] == "hard"]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    ax[0].plot([r[2] for r in hard], [r[4] for r in hard], "o-")
    ax[0].set(xlabel="LLM labels per question (training)", ylabel="held-out macro F1", title="MBQA fidelity")
    ax[1].plot([r[2] for r in hard], [r[5] for r in hard], "o-", color="C1")
    ax[1].set(xlabel="LLM labels per question (training)", ylabel="STS-B Spearman x 100", title="STS-B (binary, tau 0.5)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "label_efficiency.png"), dpi=120)
    full = [r for r in hard if r[1] == 1.0]
    half = [r for r in hard if r[1] == 0.5]
    if full and half:
        print(f"macro_f1_half_vs_all_labels: {half[0][4] / full[0][4]:.3f}")


if __name__ == "__main__":
    main()
