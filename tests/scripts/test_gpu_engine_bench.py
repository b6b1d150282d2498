"""bench/gpu_engine.py on a CPU with a tiny random model (no Ray): the GPU run's code path, its lines and its results."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_engine.py"


def test_gpu_engine_bench_runs_its_cpu_shape_and_prints_its_last_line(tmp_path):
    args = ["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--texts", "3", "--questions", "4", "--max-seqs", "4", "12",
            "--unshared", "12", "--gen-prompts", "3", "--gen-len", "48", "--max-new", "6", "--gen-seqs", "3", "--gen-single", "2",
            "--json", str(tmp_path / "r.json")]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["device"], res["dtype"], res["pairs"], res["prompt_tokens"]) == ("cpu", "float32", 12, 40 + 90 + 16 + 4)
    # one tree of 12 computes the prefix once, each text once and each question's tail: (40 + 3 * 90 + 12 * 20) / 12 tokens a pair
    assert res["tree_12_tokens_computed_per_pair"] == (40 + 3 * 90 + 12 * 20) / 12
    assert res["max_p_yes_gap_tree_vs_unshared"] < 1e-5  # the trees' P(yes) are the one-prompt passes' (float32)
    assert res["peak_gpu_gib"] is None and res["gen_batched_tokens_per_s"] > 0 and res["gen_single_tokens_per_s"] > 0
    name, value = out.stdout.strip().splitlines()[-1].split(": ")
    best = max(res["tree_4_pairs_per_s"], res["tree_12_pairs_per_s"])
    assert (name, value) == ("gpu_single_pass_tree_vs_unshared", f"{best / res['unshared_pairs_per_s']:.2f}")
