"""A long-lived encoder's memory over calls of many shapes: OpenVINO's runtime cache at its default (5,000 shapes) and
as cqg_ray sets it (`encoder_export.OPENVINO_CPU_CONFIG`), side by side, each in a process of its own.

    python bench/encoder_shapes.py [--calls 1600] [--texts 3000]

Each process loads the bundled MiniLM on openvino (2 threads), times `encode` on --texts real sentences (batch 32),
then makes --calls calls of 1-20 random texts of 3-60 corpus words each (as a Serve replica's batches come: every call
a new (batch, length) pair, mostly), printing its RSS every quarter, and times the sentences again. Then the same with
the cache off (0), for the speed it costs. Last line: `encoder_shapes_rss_growth_default_over_ours: X` (the growth of
RSS over the mixed calls at OpenVINO's default, over ours).
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

from _common import corpus_sample

CHILD = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
import cqg_ray.encoder_export as ee
cap, calls, texts = sys.argv[2], int(sys.argv[3]), json.loads(sys.stdin.read())
if cap != "ours":
    ee.OPENVINO_CPU_CONFIG = {k: v for k, v in ee.OPENVINO_CPU_CONFIG.items() if k != "CPU_RUNTIME_CACHE_CAPACITY"}
    if cap != "default":
        ee.OPENVINO_CPU_CONFIG["CPU_RUNTIME_CACHE_CAPACITY"] = int(cap)
from cqg_ray.encoder import load_encoder
enc = load_encoder("bundled:all-MiniLM-L6-v2", backend="openvino", threads=2)
rss = lambda: int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
enc.encode(texts[:64], batch_size=32)
t0 = time.time(); enc.encode(texts, batch_size=32); before = len(texts) / (time.time() - t0)
rng, words, start, marks = random.Random(0), " ".join(texts).split(), rss(), []
for i in range(calls):
    enc.encode([" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) for _ in range(rng.randint(1, 20))], batch_size=32)
    if (i + 1) % (calls // 4) == 0:
        marks.append(round(rss()))
t0 = time.time(); enc.encode(texts, batch_size=32); after = len(texts) / (time.time() - t0)
print(json.dumps({"cap": cap, "texts_per_s_before": round(before), "texts_per_s_after": round(after), "rss_start_mb": round(start),
                  "rss_marks_mb": marks, "peak_rss_mb": round(int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024)}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1600)
    ap.add_argument("--texts", type=int, default=3000)
    args = ap.parse_args()
    texts = json.dumps(corpus_sample(args.texts))
    root = os.path.join(os.path.dirname(__file__), "..")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = {}
    for cap in ("default", "ours", "0"):
        out = subprocess.run([sys.executable, "-c", CHILD, root, cap, str(args.calls)], input=texts, capture_output=True, text=True,
                             env=env, check=True).stdout
        runs[cap] = json.loads(out.strip().splitlines()[-1])
        r = runs[cap]
        print(f"cache {cap:>7}: {r['texts_per_s_before']} texts/s, RSS {r['rss_start_mb']} MB -> {r['rss_marks_mb']} MB over "
              f"{args.calls} calls of many shapes (peak {r['peak_rss_mb']} MB), then {r['texts_per_s_after']} texts/s", flush=True)
    growth = {c: r["rss_marks_mb"][-1] - r["rss_start_mb"] for c, r in runs.items()}
    print(f"RSS growth: default {growth['default']} MB, ours {growth['ours']} MB, off {growth['0']} MB")
    print(f"encoder_shapes_rss_growth_default_over_ours: {growth['default'] / max(growth['ours'], 1):.2f}")


if __name__ == "__main__":
    main()
