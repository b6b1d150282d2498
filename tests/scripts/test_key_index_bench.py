"""bench/key_index.py end to end on a small ledger (no Ray): its lines and the index it measures."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "key_index.py"


def test_key_index_bench_prints_the_build_and_its_last_line():
    out = subprocess.run([sys.executable, str(SCRIPT), "--keys", "3000", "--shards", "3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[1] == "ledger: 3,000 keys in 3 shards written in " + lines[1].split(" written in ")[1]
    assert lines[2].startswith("build: 3,000 keys in ") and "the index holds 0 MB (41 bytes a key)" in lines[2]
    name, value = lines[-1].split(": ")
    assert name == "key_index_peak_over_held" and float(value) > 0
