"""bench/own_cluster.py's rule table on synthetic probe counts (no run, no LLM)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "own_cluster.py"
_spec = importlib.util.spec_from_file_location("bench_own_cluster", SCRIPT)
own = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_own_cluster", own)
_spec.loader.exec_module(own)


def test_each_rule_keeps_what_its_bar_and_floor_allow():
    # cluster 0: 4 of 6 positives yes (kept by every rule), 2 of 6 with Eq. 1 0.2, 1 of 6 with Eq. 1 -0.1;
    # cluster 1: 2 of 6 with Eq. 1 0 (not above the floor), a copy (dropped by a text filter whatever its probes), unprobed
    cand = {"cluster": np.array([0, 0, 0, 1, 1, 1]), "quality": np.array([0.5, 0.2, -0.1, 0.0, 0.9, np.nan]),
            "positive_yes": np.array([4, 2, 1, 2, 6, 0]), "positive_n": np.array([6, 6, 6, 6, 6, 0]),
            "filtered": np.array(["", "own_cluster", "own_cluster", "own_cluster", "copy", ""])}
    rows = {(r["share"], r["floor"]): r for r in own.keeps(cand, own.RULES, t=1, prompts=2)}
    assert [rows[(0.5, None)][k] for k in ("kept", "per_prompt", "clusters_without", "top_t")] == [1, 0.5, 1, 1]
    assert rows[(1 / 3, None)]["kept"] == 1  # 2 of 6 is at a third, not above it
    assert rows[(1 / 6, None)]["kept"] == 3 and rows[(1 / 6, None)]["top_t"] == 2  # 1 of 6 is at the bar, not above it
    assert rows[(1 / 6, 0.0)]["kept"] == 2 and rows[(1 / 6, 0.0)]["quality_median"] == 0.35 and rows[(1 / 6, 0.0)]["clusters_without"] == 1
    assert rows[(0.0, 0.0)]["kept"] == 2  # the negative-quality and the zero-quality ones go
