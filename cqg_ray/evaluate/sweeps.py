"""The paper's two trade-off studies on STS (section 4.5 and 4.6, Figures 4 and 5), and the load budget sweep:

- m sweep (Figure 4): keep only the first m questions, under the model's budget; STS Spearman (quality) rises with
  m, cognitive load (Eq. 5) rises with it too.
- tau sweep (Figure 5): threshold the same probabilities at each tau (0/1 values); a higher tau gives fewer "yes"
  dimensions, a lower cognitive load (more interpretable) and usually a lower Spearman.
- budget sweep: per text the k most confident questions (``budget_curves``: 0/1, probability and centred values),
  for each k of ``evaluate.active_k``, on STS (with the load), retrieval and clustering.

All take probabilities computed once (``StsProbs``) and only apply budgets / slice them (``cqg_ray.mbqa.budget``).
``plot_sweep`` draws a sweep as two labelled panels and ``plot_frontier`` quality against load, one curve per rule;
both return PNG bytes (``agg_figure``: matplotlib's Agg canvas, no pyplot, so they never touch a user's backend;
``png_bytes``), as does the faithfulness sweep's plot (``faith_sweep.plot_sweep``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from cqg_ray.evaluate.metrics import cognitive_load, sts_spearman
from cqg_ray.mbqa.budget import Budget, apply_budget


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


def with_average(per: dict[str, list[float]]) -> dict[str, list[float]]:
    """The per-dataset lists with an "Avg." list beside them when there are several datasets."""
    if len(per) > 1:
        per = {**per, "Avg.": [float(np.mean(vals)) for vals in zip(*per.values())]}
    return per


def usable_ms(ms: list[int], m_max: int) -> list[int]:
    """The sweep's m values a model of ``m_max`` questions can give (1..m_max), sorted; none is a ValueError."""
    usable = sorted({m for m in ms if 1 <= m <= m_max})
    if not usable:
        raise ValueError(f"no m in {list(ms)} is at most the model's {m_max} questions")
    return usable


def m_sweep(data: list[StsProbs], budget: Budget, ms: list[int], mean: np.ndarray | None = None) -> dict:
    """Spearman (x100) and cognitive load against m (a model of the first m questions under ``budget``), per
    dataset and averaged ("Avg.")."""
    if not data:
        raise ValueError("the m sweep needs at least one STS dataset")
    ms = usable_ms(ms, data[0].probs.shape[1])
    rho: dict[str, list[float]] = {}
    load: dict[str, list[float]] = {}
    for d in data:
        pts = [_point(apply_budget(d.probs[:, :m], budget, None if mean is None else mean[:m])[1], d) for m in ms]
        rho[d.name] = [p[0] for p in pts]
        load[d.name] = [p[1] for p in pts]
    return {"x": "m", "values": ms, "budget": budget.name, "spearman": with_average(rho), "cognitive_load": with_average(load)}


def tau_sweep(data: list[StsProbs], taus: list[float]) -> dict:
    """Spearman (x100) and cognitive load against tau (all m dimensions), per dataset and averaged."""
    if not data:
        raise ValueError("the tau sweep needs at least one STS dataset")
    taus = sorted(set(float(t) for t in taus))
    rho: dict[str, list[float]] = {}
    load: dict[str, list[float]] = {}
    for d in data:
        pts = [_point(apply_budget(d.probs, Budget(rule="tau", tau=t))[1], d) for t in taus]
        rho[d.name] = [p[0] for p in pts]
        load[d.name] = [p[1] for p in pts]
    return {"x": "tau", "values": taus, "spearman": with_average(rho), "cognitive_load": with_average(load)}


def budget_curves(model_budget: Budget, ks: list[int], has_mean: bool) -> dict[str, list[Budget]]:
    """The budget sweep's rules: top-k at the model's floor (none for a tau-rule model), valued 0/1, by probability,
    and centred, ranked by p, then centred ranked by p - mean and by probability ranked by p - 0.5 mean above the floor
    (rank lift; those three when the model has the means); one Budget per k."""
    floor = model_budget.floor if model_budget.rule == "top_k" else None
    kinds = [("one", "prob"), ("prob", "prob")] + ([("centred", "prob"), ("centred", "centred"), ("prob", "lift")] if has_mean else [])
    label = "top-k" + (f" (p > {floor:g})" if floor is not None else "")
    ranked = {"prob": "", "centred": ", ranked by p - mean", "lift": ", ranked by p - 0.5 mean"}
    return {f"{label} {VALUE_LABELS[v]}{ranked[r]}": [Budget(rule="top_k", k=k, floor=floor, value=v, rank=r) for k in ks]
            for v, r in kinds}


VALUE_LABELS = {"one": "0/1", "prob": "probability", "centred": "centred"}


def budget_sweep_sts(data: list[StsProbs], curves: dict[str, list[Budget]], mean: np.ndarray | None) -> dict:
    """Per rule: STS Spearman (x100) and cognitive load against k, per dataset and averaged."""
    out = {}
    for rule, budgets in curves.items():
        rho: dict[str, list[float]] = {}
        load: dict[str, list[float]] = {}
        for d in data:
            pts = [_point(apply_budget(d.probs, b, mean)[1], d) for b in budgets]
            rho[d.name] = [p[0] for p in pts]
            load[d.name] = [p[1] for p in pts]
        out[rule] = {"spearman": with_average(rho), "cognitive_load": with_average(load)}
    return out


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


def agg_figure(figsize: tuple[float, float]):
    """A matplotlib Figure on its own Agg canvas (no pyplot, so a user's backend is never touched)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError('the sweep plots need matplotlib: pip install "cqg-ray[plots]"') from None
    fig = Figure(figsize=figsize, dpi=110)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    """The figure laid out and rendered as PNG bytes."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_sweep(sweep: dict, title: str) -> bytes:
    """Two panels, Spearman (left) and cognitive load (right) against m or tau; PNG bytes."""
    xlabel = "number of questions m (first m dimensions)" if sweep["x"] == "m" else "binary threshold $\\tau$"
    fig = agg_figure((10, 4))
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
    return png_bytes(fig)


def plot_frontier(budget: dict, tau: dict | None, dense: float | None, default: tuple[float, float] | None, title: str) -> bytes:
    """STS quality (Avg. Spearman x100) against cognitive load: one curve per budget rule (points are k), the tau
    sweep as another, the dense encoder as a horizontal line, the model's default output as a star; PNG bytes."""
    fig = agg_figure((7.5, 5))
    ax = fig.add_subplot(1, 1, 1)

    def avg(d: dict) -> list[float]:
        return [np.nan if v is None else v for v in d.get("Avg.", next(iter(d.values())))]  # a NaN Spearman is null in the JSON

    for rule, r in budget["rules"].items():
        x, y = avg(r["sts"]["cognitive_load"]), avg(r["sts"]["spearman"])
        ax.plot(x, y, marker="o", markersize=3, label=rule)
        for k, xi, yi in zip(budget["values"], x, y):
            if np.isfinite(xi) and np.isfinite(yi):
                ax.annotate(str(k), (xi, yi), fontsize=6, xytext=(2, 2), textcoords="offset points")
    if tau:
        ax.plot(avg(tau["cognitive_load"]), avg(tau["spearman"]), marker="s", markersize=3, linestyle="--", label="tau rule (0/1)")
    if dense is not None:
        ax.axhline(dense, color="black", linewidth=1, label="dense encoder")
    if default is not None:
        ax.plot([default[0]], [default[1]], marker="*", markersize=14, color="red", linestyle="none", label="model default")
    ax.set_xscale("symlog", linthresh=1.0)  # log above 1, linear near 0 (a load of 0 happens on small models)
    ax.set_xlabel("cognitive load (questions both texts answer yes, mean over STS pairs; log scale above 1)")
    ax.set_ylabel("STS Spearman x100 (average)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return png_bytes(fig)
