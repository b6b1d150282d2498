"""Sweeps (paper Figures 4 and 5): exact monotonicity of cognitive load, agreement with direct computation, plots."""

import numpy as np
import pytest

from cqg_ray.evaluate.metrics import cognitive_load, sts_spearman
from cqg_ray.evaluate.sweeps import StsProbs, default_m_grid, m_sweep, plot_sweep, sweep_rows, tau_sweep


def _sts_probs(name, seed, n_texts=60, n_pairs=80, m=40):
    rng = np.random.default_rng(seed)
    probs = rng.beta(0.5, 2.0, size=(n_texts, m)).astype(np.float32)
    i1, i2 = rng.integers(0, n_texts, n_pairs), rng.integers(0, n_texts, n_pairs)
    return StsProbs(name, probs, i1, i2, rng.uniform(0, 5, n_pairs))


def test_default_m_grid():
    assert default_m_grid(5) == [1, 2, 3, 4, 5]
    assert default_m_grid(100) == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert default_m_grid(9614)[-1] == 9614 and len(default_m_grid(9614)) == 10


def test_m_sweep_agrees_with_direct_computation_and_load_grows_with_m():
    data = [_sts_probs("A", 0), _sts_probs("B", 1)]
    sw = m_sweep(data, tau=0.3, ms=[40, 5, 10, 20, 1000])  # 1000 > m is dropped, order is sorted
    assert sw["values"] == [5, 10, 20, 40]
    assert set(sw["spearman"]) == {"A", "B", "Avg."}
    for d in data:
        bits = (d.probs > 0.3).astype(np.uint8)
        for j, m in enumerate(sw["values"]):
            u, v = bits[d.i1, :m], bits[d.i2, :m]
            assert sw["spearman"][d.name][j] == pytest.approx(sts_spearman(u, v, d.gold), nan_ok=True)
            assert sw["cognitive_load"][d.name][j] == pytest.approx(cognitive_load(u, v))
        assert all(np.diff(sw["cognitive_load"][d.name]) >= 0)  # adding dimensions never removes shared yeses
    assert sw["cognitive_load"]["Avg."][0] == pytest.approx(np.mean([sw["cognitive_load"][n][0] for n in "AB"]))


def test_tau_sweep_load_falls_with_tau():
    data = [_sts_probs("A", 2)]
    sw = tau_sweep(data, [0.9, 0.1, 0.5, 0.3, 0.7])
    assert sw["values"] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert "Avg." not in sw["spearman"]  # one dataset: no average column
    assert all(np.diff(sw["cognitive_load"]["A"]) <= 0)  # a higher threshold never adds a yes
    bits = (data[0].probs > 0.5).astype(np.uint8)
    assert sw["cognitive_load"]["A"][2] == pytest.approx(cognitive_load(bits[data[0].i1], bits[data[0].i2]))


def test_sweep_errors():
    with pytest.raises(ValueError, match="at least one STS dataset"):
        m_sweep([], 0.5, [1])
    with pytest.raises(ValueError, match="between 1 and"):
        m_sweep([_sts_probs("A", 0, m=4)], 0.5, [10])


def test_sweep_rows_and_plot_png():
    sw = m_sweep([_sts_probs("A", 0), _sts_probs("B", 1)], 0.5, [10, 20, 40])
    rows = sweep_rows(sw)
    assert list(rows[0]) == ["m", "spearman A", "spearman B", "spearman Avg.", "load A", "load B", "load Avg."]
    assert [r["m"] for r in rows] == [10, 20, 40]
    png = plot_sweep(sw, "test")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    sw["spearman"]["A"][0] = None  # a NaN Spearman (None in JSON) must still plot
    assert plot_sweep(sw, "with a gap")[:4] == b"\x89PNG"
