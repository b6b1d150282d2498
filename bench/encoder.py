"""The encoder's backends side by side: texts/s on the same corpus texts, STS-B, and what the trained heads answer.

    python bench/encoder.py [--n 20000] [--backends torch-float32,torch-bfloat16,onnx,onnx-int8,openvino]
                            [--device cpu|cuda] [--texts FILE.json] [--sts STSBenchmark.test.tsv]

Texts: n texts drawn (seeded) from ../shared/data/corpus/sentences.jsonl.gz (40-300 characters, `corpus_sample`), or
the first n of `--texts` (a JSON list of strings: the same sample written out, for a machine without ../shared/data).
`--device cuda` runs the torch backends on the GPU (the exported ones are CPU builds and are skipped there).
Each backend (`cqg_ray.encoder.load_encoder(name, backend=...)`, the bundled MiniLM) encodes all of them in one
process with every CPU thread, batch 32 (the encode stage's CPU default), after a warm-up; the load time includes the
one-off ONNX export/quantisation when the machine's cache (~/.cache/cqg-ray/encoders) is empty. Quality, per backend:
  STS-B    Spearman x 100 of cosine similarity on STSBenchmark.test (1,379 pairs), next to torch float32's
  cos      mean and least cosine of each text's embedding to torch float32's
  flips    fraction of the previous reference model's (tests/fixtures/previous_model, m = 636, tau 0.76: the heads `auto`
           was chosen with) answer bits that differ from
           the answers on torch float32 embeddings, over all n texts (the heads were trained on float32 embeddings)
A backend "holds quality" when STS-B is within 0.3 points of float32 and flips <= 0.5% (`auto` only uses backends
that hold it on every machine measured, see cqg_ray.encoder.pick_backend).
Last line: `best_backend_vs_torch_fp32: X` = texts/s of the fastest backend that holds quality / torch float32's.
"""

import argparse
import csv
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from _common import corpus_sample, cpu_line

ROOT = os.path.join(os.path.dirname(__file__), "..")
STSB = os.path.join(ROOT, "..", "shared", "data", "sts", "STSBenchmark.test.tsv")
REF_MODEL = os.path.join(ROOT, "tests", "fixtures", "previous_model")
MAX_STS_DROP, MAX_FLIPS = 0.3, 0.005


def read_sts(path: str):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [float(r["score"]) for r in rows]


def main():
    from cqg_ray.encoder import BACKENDS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated; torch-float32 (the yardstick) is always run first")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--texts", default=None, help="a JSON list of texts (default: the shared corpus sample)")
    ap.add_argument("--sts", default=STSB, help="STS-B test TSV (sentence1, sentence2, score columns)")
    a = ap.parse_args()

    import numpy as np
    import torch
    from scipy.stats import spearmanr

    from cqg_ray.encoder import installed_backends, load_encoder, pick_backend
    from cqg_ray.hardware import cpu_flags
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    backends = ["torch-float32"] + [b for b in a.backends.split(",") if b and b != "torch-float32"]
    if a.texts:
        with open(a.texts, encoding="utf-8") as f:
            texts = json.load(f)[: a.n]
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
            sys.exit(f"--texts {a.texts}: expected a non-empty JSON list of strings")
    else:
        texts = corpus_sample(a.n)
    s1, s2, gold = read_sts(a.sts)
    cuda = a.device == "cuda"
    heads = InterpretableEmbedder.load(REF_MODEL, load_encoder=False, device="cpu")
    print(cpu_line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; texts: {len(texts)} (mean {np.mean([len(t) for t in texts]):.0f} chars), "
          f"batch {a.batch_size}; device {a.device}{' (' + torch.cuda.get_device_name() + ')' if cuda else ''}; "
          f"load average {os.getloadavg()[0]:.2f}; auto here: {pick_backend(cpu_flags(), cuda, installed_backends())[0]}")
    print(f"{'backend':15s} {'load s':>7s} {'texts/s':>8s} {'STS-B':>6s} {'cos mean':>9s} {'cos min':>8s} {'flips %':>8s}  holds quality")
    ref_emb = ref_bits = ref_sts = None
    rates = {}
    for backend in backends:
        if backend not in installed_backends():
            print(f"{backend:15s} skipped: not installed (pip install 'cqg-ray[fast-encoder]')")
            continue
        if cuda and backend not in ("torch-float32", "torch-bfloat16"):
            print(f"{backend:15s} skipped: a CPU build, not run with --device cuda")
            continue
        t0 = time.perf_counter()
        enc = load_encoder(a.model, backend=backend, device=a.device)
        t_load = time.perf_counter() - t0
        enc.encode(texts[:256], batch_size=a.batch_size)  # warm-up
        t0 = time.perf_counter()
        emb = enc.encode(texts, batch_size=a.batch_size)
        rate = len(texts) / (time.perf_counter() - t0)
        e1, e2 = enc.encode(s1, batch_size=a.batch_size), enc.encode(s2, batch_size=a.batch_size)
        sts = 100 * spearmanr((e1 * e2).sum(axis=1), gold).statistic
        bits = heads.encode_embeddings(emb, output="bits")
        if ref_emb is None:
            ref_emb, ref_bits, ref_sts = emb, bits, sts
        cos = (emb * ref_emb).sum(axis=1)
        flips = float((bits != ref_bits).mean())
        holds = abs(sts - ref_sts) <= MAX_STS_DROP and flips <= MAX_FLIPS
        if holds:
            rates[backend] = rate
        print(f"{backend:15s} {t_load:7.1f} {rate:8.1f} {sts:6.2f} {cos.mean():9.5f} {cos.min():8.4f} {100 * flips:8.3f}  "
              f"{'yes' if holds else 'no'}", flush=True)
        del enc
    best = max(rates, key=rates.get)
    print(f"fastest backend that holds quality: {best} ({rates[best]:.1f} texts/s vs torch-float32 {rates['torch-float32']:.1f})")
    print(f"best_backend_vs_torch_fp32: {rates[best] / rates['torch-float32']:.2f}")


if __name__ == "__main__":
    main()
