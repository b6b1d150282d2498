"""MBQA training throughput at the paper's size: 10,000 questions x 1,000 labelled texts each (10 M pairs).

    python bench/train.py [--m 10000] [--per-question 1000] [--docs 100000] [--workers 1] [--pairs-per-head 8]

Synthetic data: random unit embeddings (d = 384, the bundled encoder's), each question labelled on
--per-question distinct random texts out of --docs, 11.7% yes (the paper's Table 6 ratio). Our training is one
epoch of `train_heads` through Ray Train (question-major steps: every head on K of its own texts per step);
pairs/s and the epoch time are measured inside the worker, the wall time adds Ray Train's start-up.

For comparison (measured on a few steps in this process, same threads, then extrapolated to one epoch):
- the paper's steps: one text per step, all m heads run on it (here already as stacked heads, not the
  reference's module loop), loss on its labelled questions, Adam over all heads;
- text-major batches: --batch texts per step, all m heads on every text.

Last line: `train_pairs_per_s: X` (labelled pairs per second of our training epoch).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


def synthetic(m: int, per_question: int, n_docs: int, d: int, seed: int = 0):
    import numpy as np

    from cqg_ray.mbqa.pairs import LabelPairs

    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n_docs, d), dtype=np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    docs = np.concatenate([rng.choice(n_docs, per_question, replace=False) for _ in range(m)])
    question = np.repeat(np.arange(m, dtype=np.int32), per_question)
    answer = (rng.random(len(docs)) < 0.117).astype(np.int8)
    return emb, LabelPairs(docs, question, answer, m)


def text_major_step_time(emb, pairs, batch: int, steps: int, hidden: int) -> float:
    """Seconds per step of text-major training: `batch` texts, all m heads on each, loss on their labels."""
    import numpy as np
    import torch

    from cqg_ray.config import TrainConfig
    from cqg_ray.mbqa.heads import StackedHeads, masked_bce
    from cqg_ray.mbqa.loop import make_optimizer

    m = pairs.n_questions
    heads = StackedHeads(emb.shape[1], m, hidden)
    opt = make_optimizer(heads, TrainConfig())
    order = np.argsort(pairs.doc, kind="stable")
    doc_sorted = pairs.doc[order]
    rng = np.random.default_rng(1)
    times = []
    for s in range(steps + 1):
        rows = rng.choice(len(emb), batch, replace=False)
        lo, hi = np.searchsorted(doc_sorted, rows), np.searchsorted(doc_sorted, rows, side="right")
        y = np.zeros((batch, m), np.float32)
        mask = np.zeros((batch, m), bool)
        for b in range(batch):
            sel = order[lo[b] : hi[b]]
            y[b, pairs.question[sel]] = pairs.answer[sel]
            mask[b, pairs.question[sel]] = True
        t0 = time.perf_counter()
        loss = masked_bce(heads(torch.from_numpy(emb[rows])), torch.from_numpy(y), torch.from_numpy(mask), 7.5)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s:  # the first step warms up
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=10_000)
    ap.add_argument("--per-question", type=int, default=1_000)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--pairs-per-head", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cpus-per-worker", type=float, default=2.0)
    ap.add_argument("--use-gpu", action="store_true")
    ap.add_argument("--batch", type=int, default=256, help="texts per step of the text-major comparison")
    ap.add_argument("--ref-steps", type=int, default=5)
    ap.add_argument("--skip-reference", action="store_true")
    a = ap.parse_args()

    import ray
    import torch

    from cqg_ray.config import TrainConfig
    from cqg_ray.log import setup_logging
    from cqg_ray.mbqa.train import train_heads

    setup_logging("WARNING")
    t0 = time.perf_counter()
    emb, pairs = synthetic(a.m, a.per_question, a.docs, a.d)
    n_pairs = len(pairs)
    per_text = n_pairs / a.docs
    print(f"synthetic labels: {a.m} questions x {a.per_question} texts = {n_pairs:,} pairs over {a.docs:,} texts "
          f"({per_text:.0f} labels per text), d={a.d}, built in {time.perf_counter() - t0:.1f}s | load average {os.getloadavg()[0]:.2f}")

    ray.init(num_cpus=max(2, int(a.cpus_per_worker * a.workers)), include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    cfg = TrainConfig(epochs=1, hidden=a.hidden, pairs_per_head=a.pairs_per_head, num_workers=a.workers,
                      cpus_per_worker=a.cpus_per_worker, use_gpu=a.use_gpu, checkpoint_every=1)
    storage = tempfile.mkdtemp(prefix="bench-train-")
    t0 = time.perf_counter()
    result = train_heads(emb, pairs, cfg, storage, "bench")
    wall = time.perf_counter() - t0
    ours = result.metrics
    ray.shutdown()

    rows = [("ours: question-major, Ray Train", ours["pairs_per_s"], ours["seconds"], f"{ours['steps']} steps of K={a.pairs_per_head}/head")]
    if not a.skip_reference:
        torch.set_num_threads(max(1, int(a.cpus_per_worker)))
        t1 = text_major_step_time(emb, pairs, 1, a.ref_steps, a.hidden)
        rows.append(("paper: 1 text/step, all heads", per_text / t1, a.docs * t1, f"{t1 * 1e3:.0f} ms/step, extrapolated"))
        tb = text_major_step_time(emb, pairs, a.batch, a.ref_steps, a.hidden)
        rows.append((f"text-major: {a.batch} texts/step, all heads", a.batch * per_text / tb, a.docs / a.batch * tb,
                     f"{tb * 1e3:.0f} ms/step, extrapolated"))
    print(f"\n{'training design':<40}{'pairs/s':>12}{'s/epoch':>10}{'vs ours':>9}  note")
    for name, pps, sec, note in rows:
        print(f"{name:<40}{pps:>12,.0f}{sec:>10.1f}{ours['pairs_per_s'] / pps:>9.1f}  {note}")
    print(f"\nRay Train wall time for the epoch, start-up and checkpoint included: {wall:.1f}s "
          f"({a.workers} worker(s) x {a.cpus_per_worker} CPU)")
    print(f"time_to_one_epoch_s: {ours['seconds']:.1f}")
    print(f"train_pairs_per_s: {ours['pairs_per_s']:.0f}")


if __name__ == "__main__":
    main()
