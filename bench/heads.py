"""Stacked MBQA heads vs the reference design (a Python list of m separate MLPs), and .encode vs the bare encoder.

    python bench/heads.py [--m 10000] [--batch 64] [--texts 2000] [--repeats 7] [--device cpu]

1. Heads alone, at m questions, the bundled encoder's dimension (d = 384) and a batch of texts: the time of
   m separate nn.Sequential(Linear(d, 8), ReLU, Linear(8, 1)) modules called in a loop (the reference
   implementation's design) divided by the time of `StackedHeads` on the same batch and weights (float32, and
   bfloat16, which uses the CPU's matrix units where it has them). Median of --repeats, inference mode.
2. `InterpretableEmbedder.encode` (encoder + m heads) throughput divided by the bare encoder's throughput
   (`SentenceTransformer.encode`, same texts, batch size and normalisation) on real texts from the shared corpus.
3. The load budget's outputs, same m, heads on precomputed embeddings (so the budget's own cost is not hidden behind
   the encoder): the shipped model's budget (top `--budget-k` = 112 ranked by p - mean, floor 0.5, centred values; a
   fixed mean of 0.3) against the paper's tau rule (p > 0.5), both as bits and as sparse (a csr_array), interleaved
   medians. The budget runs where the heads run, chunk by chunk (`cqg_ray.mbqa.budget_torch`).

Last line: `heads_stacked_vs_loop_fp32: X`; with --skip-heads, `budget_shipped_vs_tau_throughput: X` (the shipped
budget's bits over the tau rule's bits, texts/s).
"""

import argparse
import gzip
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "corpus", "sentences.jsonl.gz")
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "corpus_400.jsonl")


def median_time(fn, repeats: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_texts(n: int) -> list[str]:
    texts = []
    if os.path.exists(CORPUS):
        with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
            for line in f:
                texts.append(json.loads(line)["text"])
                if len(texts) == n:
                    break
    else:
        with open(FIXTURE, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        texts = (texts * (n // len(texts) + 1))[:n]
    return texts


def time_heads(a, heads, dev, sync):
    """Median seconds per batch: the loop of m modules, StackedHeads fp32, StackedHeads bf16 (prints the table)."""
    import torch
    from torch import nn

    from cqg_ray.mbqa.heads import StackedHeads

    mlps = []
    for i in range(a.m):
        mlp = nn.Sequential(nn.Linear(a.d, a.hidden), nn.ReLU(), nn.Linear(a.hidden, 1))
        with torch.no_grad():
            mlp[0].weight.copy_(heads.w1[i])
            mlp[0].bias.copy_(heads.b1[i])
            mlp[2].weight.copy_(heads.w2[i].unsqueeze(0))
            mlp[2].bias.copy_(heads.b2[i : i + 1])
        mlps.append(mlp.to(dev).eval())
    x = torch.randn(a.batch, a.d, device=dev)
    heads_bf16 = StackedHeads(a.d, a.m, a.hidden).to(dev)
    heads_bf16.load_state_dict(heads.state_dict())
    heads_bf16 = heads_bf16.to(torch.bfloat16).eval()
    xb = x.to(torch.bfloat16)

    def loop_of_modules():
        return torch.cat([module(x) for module in mlps], dim=1)

    with torch.inference_mode():
        ref = loop_of_modules()
        out = heads(x)
        err = (out - ref).abs().max().item()
        err_bf16 = (heads_bf16(xb).float() - ref).abs().max().item()
        t_loop = median_time(loop_of_modules, a.repeats, sync)
        t_stacked = median_time(lambda: heads(x), a.repeats, sync)
        t_bf16 = median_time(lambda: heads_bf16(xb), a.repeats, sync)
    print(f"\nheads alone: m={a.m}, d={a.d}, hidden={a.hidden}, batch={a.batch} (median of {a.repeats})")
    print(f"  {'design':<34}{'ms/batch':>10}{'texts/s':>12}{'vs loop':>9}{'max |diff|':>12}")
    print(f"  {'loop of m nn.Sequential (fp32)':<34}{t_loop * 1e3:>10.2f}{a.batch / t_loop:>12.0f}{1.0:>9.2f}{0.0:>12.1e}")
    print(f"  {'StackedHeads fp32':<34}{t_stacked * 1e3:>10.2f}{a.batch / t_stacked:>12.0f}{t_loop / t_stacked:>9.2f}{err:>12.1e}")
    print(f"  {'StackedHeads bf16':<34}{t_bf16 * 1e3:>10.2f}{a.batch / t_bf16:>12.0f}{t_loop / t_bf16:>9.2f}{err_bf16:>12.1e}")
    return t_loop, t_stacked, t_bf16


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=10_000)
    ap.add_argument("--encoder", default="bundled:all-MiniLM-L6-v2", help="encoder name or path (its dimension is d)")
    ap.add_argument("--d", type=int, default=None, help="override d (default: the encoder's dimension, 384 for MiniLM)")
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--encode-batch", type=int, default=64)
    ap.add_argument("--device", default="cuda" if __import__("torch").cuda.is_available() else "cpu")
    ap.add_argument("--skip-encode", action="store_true", help="only the heads-alone part")
    ap.add_argument("--skip-heads", action="store_true", help="only the encode part")
    ap.add_argument("--budget-k", type=int, default=112, help="k of the top-k budget in part 3 (the shipped model's)")
    ap.add_argument("--budget-texts", type=int, default=8192, help="embeddings per call in part 3")
    a = ap.parse_args()

    import torch

    from cqg_ray.mbqa.heads import StackedHeads

    from cqg_ray.encoder import load_encoder

    dev = torch.device(a.device)
    encoder = load_encoder(a.encoder, device=a.device)
    a.d = a.d or encoder.dim
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    print(f"device {dev} | torch {torch.__version__} | threads {torch.get_num_threads()} | load average {os.getloadavg()[0]:.2f}")
    torch.manual_seed(0)
    heads = StackedHeads(a.d, a.m, a.hidden).to(dev).eval()
    if not a.skip_heads:
        t_loop, t_stacked, t_bf16 = time_heads(a, heads, dev, sync)

    if not a.skip_encode:
        from cqg_ray.mbqa.embedder import InterpretableEmbedder

        texts = read_texts(a.texts)
        questions = [{"id": f"q{i}", "text": f"question {i}"} for i in range(a.m)]
        model = InterpretableEmbedder(a.encoder, questions, heads.cpu(), device=a.device, encoder=encoder)
        bare = lambda t: encoder.encode(t, batch_size=a.encode_batch)  # noqa: E731
        full = lambda t: model.encode(t, batch_size=a.encode_batch, progress=False)  # noqa: E731
        bare(texts[:128])
        bits = full(texts[:128])

        def once(fn):
            t0 = time.perf_counter()
            out = fn(texts)
            sync()
            return time.perf_counter() - t0, out

        t_bare, t_full = [], []
        for _ in range(3):  # interleaved, so that a busy neighbour hurts both sides alike
            t_bare.append(once(bare)[0])
            t, bits = once(full)
            t_full.append(t)
        tb, tf = statistics.median(t_bare), statistics.median(t_full)
        print(f"\nencode: {len(texts)} real texts, encoder batch {a.encode_batch}, m={a.m} (median of 3, interleaved)")
        print(f"  {'bare encoder':<34}{len(texts) / tb:>10.0f} texts/s")
        print(f"  {'InterpretableEmbedder.encode':<34}{len(texts) / tf:>10.0f} texts/s  (output {bits.shape} {bits.dtype})")
        print(f"  encode_vs_bare_encoder: {tb / tf:.3f}")
    if not a.skip_encode:
        import numpy as np

        from cqg_ray.mbqa.budget import Budget

        emb = torch.nn.functional.normalize(torch.randn(a.budget_texts, a.d), dim=1).numpy()
        mean = np.full(a.m, 0.3, dtype=np.float32)
        budget = Budget(rule="top_k", k=min(a.budget_k, a.m), floor=0.5, value="centred", rank="centred")
        tau = Budget(rule="tau", tau=0.5)
        model = InterpretableEmbedder(a.encoder, questions, heads.cpu(), device=a.device, encoder=encoder, budget=budget, mean=mean)
        runs = {"tau rule bits": lambda: model.encode_embeddings(emb, output="bits", budget=tau),
                "tau rule sparse": lambda: model.encode_embeddings(emb, output="sparse", budget=tau),
                "shipped budget bits": lambda: model.encode_embeddings(emb, output="bits"),
                "shipped budget sparse": lambda: model.encode_embeddings(emb, output="sparse")}
        times = {name: [] for name in runs}
        for fn in runs.values():
            fn()
        for _ in range(a.repeats):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(v) for name, v in times.items()}
        nnz = model.encode_embeddings(emb[:512], output="sparse").nnz / 512
        print(f"\nbudget outputs: {a.budget_texts} embeddings, m={a.m}, budget {budget.name} ({nnz:.1f} active a text), "
              f"heads fp32 (median of {a.repeats}, interleaved)")
        for name, t in med.items():
            print(f"  {name:<34}{a.budget_texts / t:>10.0f} texts/s")
        print(f"  shipped budget sparse / bits: {med['shipped budget bits'] / med['shipped budget sparse']:.3f}")
        print(f"  shipped budget sparse / tau rule sparse: {med['tau rule sparse'] / med['shipped budget sparse']:.3f}")
        shipped_vs_tau = med["tau rule bits"] / med["shipped budget bits"]
        print(f"  shipped budget bits / tau rule bits: {shipped_vs_tau:.3f}")
    if a.skip_heads and not a.skip_encode:
        print(f"\nbudget_shipped_vs_tau_throughput: {shipped_vs_tau:.3f}")
    if not a.skip_heads:
        print(f"\nheads_stacked_vs_loop_bf16: {t_loop / t_bf16:.2f}")
        print(f"heads_stacked_vs_loop_fp32: {t_loop / t_stacked:.2f}")


if __name__ == "__main__":
    main()
