"""The ledger's key index (`cqg_ray.llm.ledger.KeyIndex.build`) on a synthetic ledger: its peak memory per key.

    python bench/key_index.py [--keys 1200000] [--shards 25]

Writes a labels ledger of --keys finished rows (sha256 keys, as `request_key` makes them) in --shards shards, then,
in a fresh process (so the peak is the build's own), builds the index and prints the build's time, the increase of the
process's peak RSS (VmHWM, reset just before the build) over its RSS before, that increase per key, and the bytes the
index holds. The label stage builds this index in one Ray task (`ledger_index`); `cqg_ray/plan/memory.py` predicts its
memory with ``KEY_INDEX_BYTES`` a request. Last line: `key_index_peak_over_held: X` (the build's peak increase over the
index it leaves; 1.0 would be no transient copy at all).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MEASURE = r"""
import json, sys, time
from cqg_ray.llm.ledger import KeyIndex, Ledger
from cqg_ray.rundir import RunDir

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

ledger = Ledger(RunDir(sys.argv[1]), "labels")
ledger.shards()
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
t0 = time.time()
index = KeyIndex.build(ledger)
print(json.dumps({"keys": len(index), "seconds": time.time() - t0, "peak_increase": status("VmHWM") - before,
                  "held": sum(a.nbytes for a in (index.keys, index.ok, index.shard, index.row))}))
"""


def write_ledger(run_dir: str, keys: int, shards: int) -> None:
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.rundir import RunDir

    ledger = Ledger(RunDir(run_dir), "labels")
    per = -(-keys // shards)
    for s in range(shards):
        rows = range(s * per, min(keys, (s + 1) * per))
        ledger.append([{"key": hashlib.sha256(str(i).encode()).hexdigest(), "text": "yes", "ok": True, "answers": [True],
                        "p_yes": [0.9], "attempts": 1} for i in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_200_000, help="finished rows in the ledger")
    ap.add_argument("--shards", type=int, default=25, help="ledger shards they are written in")
    a = ap.parse_args(argv)
    from _common import cpu_line

    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        write_ledger(tmp, a.keys, a.shards)
        print(f"ledger: {a.keys:,} keys in {a.shards} shards written in {time.time() - t0:.1f} s")
        out = subprocess.run([sys.executable, "-c", MEASURE, tmp], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT})
        if out.returncode != 0:
            print(out.stderr[-3000:])
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
    mb = 2**20
    print(f"build: {r['keys']:,} keys in {r['seconds']:.2f} s; peak RSS +{r['peak_increase'] / mb:.0f} MB "
          f"({r['peak_increase'] / r['keys']:.0f} bytes a key); the index holds {r['held'] / mb:.0f} MB ({r['held'] / r['keys']:.0f} bytes a key)")
    print(f"key_index_peak_over_held: {r['peak_increase'] / r['held']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
