"""Sweeps (paper Figures 4 and 5): exact monotonicity of cognitive load, agreement with direct computation, plots."""

import numpy as np
import pytest

from cqg_ray.evaluate.metrics import cognitive_load, sts_spearman
from cqg_ray.evaluate.sweeps import (
    StsProbs,
    budget_curves,
    budget_sweep_sts,
    default_m_grid,
    m_sweep,
    plot_frontier,
    plot_sweep,
    sweep_rows,
    tau_sweep,
)
from cqg_ray.mbqa.budget import Budget, apply_budget

TAU3 = Budget(rule="tau", tau=0.3)
TAU5 = Budget(rule="tau", tau=0.5)


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
    sw = m_sweep(data, TAU3, ms=[40, 5, 10, 20, 1000])  # 1000 > m is dropped, order is sorted
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
        m_sweep([], TAU5, [1])
    with pytest.raises(ValueError, match=r"^no m in \[10, 0\] is at most the model's 4 questions$"):
        m_sweep([_sts_probs("A", 0, m=4)], TAU5, [10, 0])


def test_sweep_rows_and_plot_png():
    sw = m_sweep([_sts_probs("A", 0), _sts_probs("B", 1)], TAU5, [10, 20, 40])
    rows = sweep_rows(sw)
    assert list(rows[0]) == ["m", "spearman A", "spearman B", "spearman Avg.", "load A", "load B", "load Avg."]
    assert [r["m"] for r in rows] == [10, 20, 40]
    png = plot_sweep(sw, "test")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    sw["spearman"]["A"][0] = None  # a NaN Spearman (None in JSON) must still plot
    assert plot_sweep(sw, "with a gap")[:4] == b"\x89PNG"



def test_m_sweep_under_a_top_k_budget_picks_among_the_first_m_questions():
    d = _sts_probs("A", 3)
    mean = d.probs.mean(axis=0)
    b = Budget(rule="top_k", k=4, floor=None, value="centred", rank="centred")
    sw = m_sweep([d], b, [10, 40], mean)
    V = apply_budget(d.probs[:, :10], b, mean[:10])[1]
    assert sw["budget"] == "top4 centred by p-mean"
    assert sw["spearman"]["A"][0] == pytest.approx(sts_spearman(V[d.i1], V[d.i2], d.gold))
    assert max(sw["cognitive_load"]["A"]) <= 4


def test_budget_curves_and_sweep_and_frontier_png():
    curves = budget_curves(Budget(rule="top_k", k=8, floor=0.5, value="centred", rank="centred"), [2, 4, 8], has_mean=True)
    assert list(curves) == ["top-k (p > 0.5) 0/1", "top-k (p > 0.5) probability", "top-k (p > 0.5) centred",
                            "top-k (p > 0.5) centred, ranked by p - mean", "top-k (p > 0.5) probability, ranked by p - 0.5 mean"]
    assert curves["top-k (p > 0.5) probability, ranked by p - 0.5 mean"][2] == Budget(rule="top_k", k=8, floor=0.5, value="prob", rank="lift",
                                                                                         lift=0.5)
    assert curves["top-k (p > 0.5) centred, ranked by p - mean"][1] == Budget(rule="top_k", k=4, floor=0.5, value="centred", rank="centred")
    assert list(budget_curves(TAU5, [2], has_mean=False)) == ["top-k 0/1", "top-k probability"]  # a tau model: no floor, no means
    data = [_sts_probs("A", 4), _sts_probs("B", 5)]
    mean = data[0].probs.mean(axis=0)
    sw = budget_sweep_sts(data, curves, mean)
    for rule, budgets in curves.items():
        for j, b in enumerate(budgets):
            V = apply_budget(data[1].probs, b, mean)[1]
            assert sw[rule]["spearman"]["B"][j] == pytest.approx(sts_spearman(V[data[1].i1], V[data[1].i2], data[1].gold), nan_ok=True)
            assert sw[rule]["cognitive_load"]["B"][j] == pytest.approx(cognitive_load(V[data[1].i1], V[data[1].i2]))
        assert all(np.diff(sw[rule]["cognitive_load"]["Avg."]) >= 0)  # a bigger budget never shares fewer questions
    budget = {"values": [2, 4, 8], "rules": {rule: {"sts": r} for rule, r in sw.items()}}
    png = plot_frontier(budget, tau_sweep(data, [0.3, 0.5]), 70.0, (3.0, 20.0), "test")
    assert png[:4] == b"\x89PNG" and len(png) > 10_000
    # a tiny model: no pair shares a question (load 0 everywhere) and the Spearman is undefined (null)
    flat = {"values": [2], "rules": {"r": {"sts": {"spearman": {"A": [None]}, "cognitive_load": {"A": [0.0]}}}}}
    assert plot_frontier(flat, None, None, None, "empty")[:4] == b"\x89PNG"
