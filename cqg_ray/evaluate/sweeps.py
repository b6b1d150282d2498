"""The paper's two trade-off studies on STS (section 4.5 and 4.6, Figures 4 and 5):

- m sweep (Figure 4): keep only the first m dimensions (questions) of the binary embedding at the model's tau;
  STS Spearman (quality) rises with m, cognitive load (Eq. 5) rises with it too.
- tau sweep (Figure 5): threshold the same probabilities at each tau; a higher tau gives fewer "yes"
  dimensions, a lower cognitive load (more interpretable) and usually a lower Spearman.

Both take probabilities computed once (``StsProbs``) and only re-threshold / slice them.
``plot_sweep`` draws the two quantities as two labelled panels and returns PNG bytes (matplotlib's Agg
canvas, no pyplot, so it never touches a user's backend).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from cqg_ray.evaluate.metrics import cognitive_load, sts_spearman
from cqg_ray.evaluate.models import binarize


@dataclass
class StsProbs:
    """One STS dataset as the sweeps need it: probabilities of its distinct texts and the pair indices."""

    name: str
    probs: np.ndarray  # (n_texts, m) float32
    i1: np.ndarray
    i2: np.ndarray
    gold: np.ndarray


def default_m_grid(m: int, points: int = 10) -> list[int]:
    """About ``points`` evenly spaced numbers of questions from m/points to m (1..m when m is small)."""
    if m <= points:
        return list(range(1, m + 1))
    return sorted({max(1, round(m * i / points)) for i in range(1, points + 1)})


def _point(bits: np.ndarray, d: StsProbs) -> tuple[float, float]:
    u, v = bits[d.i1], bits[d.i2]
    return sts_spearman(u, v, d.gold), cognitive_load(u, v)


def _with_average(per: dict[str, list[float]]) -> dict[str, list[float]]:
    if len(per) > 1:
        per = {**per, "Avg.": [float(np.mean(vals)) for vals in zip(*per.values())]}
    return per


def m_sweep(data: list[StsProbs], tau: float, ms: list[int]) -> dict:
    """Spearman (x100) and cognitive load against m, per dataset and averaged ("Avg.")."""
    if not data:
        raise ValueError("the m sweep needs at least one STS dataset")
    m_max = data[0].probs.shape[1]
    ms = sorted({m for m in ms if 1 <= m <= m_max})
    if not ms:
        raise ValueError(f"no m in the sweep is between 1 and the model's {m_max} dimensions")
    rho: dict[str, list[float]] = {}
    load: dict[str, list[float]] = {}
    for d in data:
        bits = binarize(d.probs, tau)
        pts = [_point(bits[:, :m], d) for m in ms]
        rho[d.name] = [p[0] for p in pts]
        load[d.name] = [p[1] for p in pts]
    return {"x": "m", "values": ms, "tau": tau, "spearman": _with_average(rho), "cognitive_load": _with_average(load)}


def tau_sweep(data: list[StsProbs], taus: list[float]) -> dict:
    """Spearman (x100) and cognitive load against tau (all m dimensions), per dataset and averaged."""
    if not data:
        raise ValueError("the tau sweep needs at least one STS dataset")
    taus = sorted(set(float(t) for t in taus))
    rho: dict[str, list[float]] = {}
    load: dict[str, list[float]] = {}
    for d in data:
        pts = [_point(binarize(d.probs, t), d) for t in taus]
        rho[d.name] = [p[0] for p in pts]
        load[d.name] = [p[1] for p in pts]
    return {"x": "tau", "values": taus, "spearman": _with_average(rho), "cognitive_load": _with_average(load)}


def sweep_rows(sweep: dict) -> list[dict]:
    """The sweep as table rows: one per x value, one Spearman and one load column per dataset."""
    rows = []
    for j, x in enumerate(sweep["values"]):
        row = {sweep["x"]: x}
        for name, vals in sweep["spearman"].items():
            row[f"spearman {name}"] = vals[j]
        for name, vals in sweep["cognitive_load"].items():
            row[f"load {name}"] = vals[j]
        rows.append(row)
    return rows


def plot_sweep(sweep: dict, title: str) -> bytes:
    """Two panels, Spearman (left) and cognitive load (right) against m or tau; PNG bytes."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError('the sweep plots need matplotlib: pip install "cqg-ray[plots]"') from None

    xlabel = "number of questions m (first m dimensions)" if sweep["x"] == "m" else "binary threshold $\\tau$"
    fig = Figure(figsize=(10, 4), dpi=110)
    FigureCanvasAgg(fig)
    panels = [("spearman", "STS Spearman x100 (higher = better quality)"), ("cognitive_load", "cognitive load (lower = more interpretable)")]
    for k, (key, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, 2, k + 1)
        for name, vals in sweep[key].items():
            avg = name == "Avg."
            vals = [np.nan if v is None else v for v in vals]  # a NaN Spearman is null in the JSON
            ax.plot(sweep["values"], vals, marker="o", markersize=3, linewidth=2.5 if avg else 1.2,
                    color="black" if avg else None, label=name, alpha=1.0 if avg else 0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
