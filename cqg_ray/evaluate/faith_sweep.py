"""The budget sweep's faithfulness axis: the judge's yes-rate on what each load budget would show, from one sample.

    budgets = sweep_budgets(model.budget, ks=[8, 16, 32], floors=[0.5, 0.8], has_mean=True)
    picks = sample_candidates(probs, floor=0.5, per_text=10, seed=0)         # (row, question) pairs to judge
    rows = sweep_figures(probs, mean, budgets, picks, judge_yes, floor=0.5)   # one row per budget
    best = choose(rows, min_active=10, max_without=0.05)

Every budget in the sweep shows only questions with P(yes) above its floor, so all of them show questions from one
candidate pool per text: P(yes) > the lowest floor. The judge answers a seeded uniform sample of at most ``per_text``
of each text's pool, once; a budget's yes precision is then estimated from the sampled pairs it would show, each
weighted by its text's pool size over the text's sample size (a ratio estimator of the judge's yes-rate over every
(text, shown question) pair of the sampled texts). ``judged`` is the number of sampled pairs behind that estimate.
The mean active questions a text and the share of texts with none are exact (from P(yes), no judge).
"""

from __future__ import annotations

import numpy as np

from cqg_ray.evaluate.data import sample_of
from cqg_ray.mbqa.budget import Budget, active_mask


BUDGET_FIELDS = ("rule", "tau", "k", "floor", "value", "rank", "lift")  # a row's budget, None where its rule has no such field


def sweep_budgets(model_budget: Budget, ks: list[int], floors: list[float], has_mean: bool,
                  lifts: list[float] | tuple[float, ...] = ()) -> list[Budget]:
    """The model's own budget first, then top-k ranked by p (and, where the model has its means, by p - mean and by
    each of ``lifts``) at every floor and k (values do not change which questions are shown, so each budget keeps the
    model's value)."""
    value = model_budget.value if (has_mean or model_budget.value != "centred") else "one"
    ranks = ([("prob", {}), ("centred", {})] + [("lift", {"lift": float(x)}) for x in lifts]) if has_mean else [("prob", {})]
    out = [model_budget]
    for rank, lift in ranks:
        for floor in floors:
            for k in ks:
                b = Budget(rule="top_k", k=int(k), floor=float(floor), value=value, rank=rank, **lift)
                if b not in out:
                    out.append(b)
    return out


def rank_label(row: dict) -> str:
    """How a sweep row ranks, in words: ``p``, ``p - mean``, ``p - 0.5 mean``."""
    rank = row.get("rank")
    return f"p - {row['lift']:g} mean" if rank == "lift" else "p - mean" if rank == "centred" else "p"


def lowest_floor(budgets: list[Budget]) -> float:
    """The P(yes) above which every budget of the sweep shows its questions (a floor of null shows any: 0)."""
    return min(float(b.tau) if b.rule == "tau" else (0.0 if b.floor is None else float(b.floor)) for b in budgets)


def sample_candidates(probs: np.ndarray, floor: float, per_text: int, seed: int) -> list[tuple[int, int]]:
    """(row, question) pairs: per row, a seeded uniform sample of at most ``per_text`` of its questions with
    P(yes) > ``floor``, by question index within a row."""
    rng = np.random.default_rng([seed, 0x5357])  # "SW": independent of the protocol's own draw
    out: list[tuple[int, int]] = []
    for row, p in enumerate(np.asarray(probs)):
        out += [(row, int(q)) for q in sample_of(rng, np.flatnonzero(p > floor), per_text)]
    return out


def sweep_figures(probs: np.ndarray, mean: np.ndarray | None, budgets: list[Budget], picks: list[tuple[int, int]], judge_yes,
                  floor: float) -> list[dict]:
    """Per budget: its estimated yes precision (module docstring), the sampled pairs behind it, the mean active
    questions a text and the share of texts with none. A budget that shows no sampled pair has precision None."""
    probs = np.asarray(probs)
    rows = np.array([r for r, _ in picks], dtype=np.int64)
    qs = np.array([q for _, q in picks], dtype=np.int64)
    yes = np.asarray(judge_yes, dtype=np.float64)
    pool = (probs > floor).sum(axis=1)
    sampled = np.bincount(rows, minlength=len(probs)) if len(rows) else np.zeros(len(probs), np.int64)
    weight = pool[rows] / np.maximum(sampled[rows], 1) if len(rows) else np.zeros(0)
    out = []
    for b in budgets:
        act = active_mask(probs, b, mean)
        shown = act[rows, qs] if len(rows) else np.zeros(0, bool)
        den = float((weight * shown).sum())
        out.append({"budget": b.name, **dict.fromkeys(BUDGET_FIELDS), **b.to_dict(),  # every row has every field (the CSV)
                    "yes_precision": round(float((weight * shown * yes).sum()) / den, 4) if den > 0 else None,
                    "judged": int(shown.sum()),
                    "mean_active": round(float(act.sum(axis=1).mean()), 3) if len(probs) else None,
                    "texts_without_active_share": round(float((~act.any(axis=1)).mean()), 4) if len(probs) else None})
    return out


def choose(rows: list[dict], min_active: float = 10.0, max_without: float = 0.05, min_judged: int = 30) -> dict | None:
    """The row of highest estimated yes precision among those showing at least ``min_active`` questions a text on
    average, leaving at most ``max_without`` of the texts with none, and resting on at least ``min_judged`` judgements
    (ties: more active questions, then the earlier row); None when no row qualifies."""
    ok = [(i, r) for i, r in enumerate(rows) if r["yes_precision"] is not None and r["judged"] >= min_judged
          and r["mean_active"] >= min_active and r["texts_without_active_share"] <= max_without]
    if not ok:
        return None
    return max(ok, key=lambda ir: (ir[1]["yes_precision"], ir[1]["mean_active"], -ir[0]))[1]


def sweep_markdown(sweep: dict) -> list[str]:
    """The report's table of one sweep (``faithfulness()``'s ``budget_sweep``), best first, the choice named."""
    from cqg_ray.evaluate.markdown import figure, markdown_table

    rows = sorted(sweep["rows"], key=lambda r: (r["yes_precision"] is None, -(r["yes_precision"] or 0.0)))  # unestimated last
    best = sweep.get("chosen")
    out = [f"Budget sweep, faithfulness axis: the judge answered {sweep['judged']} sampled pairs ({sweep['per_text']} a text at most, "
           f"of the questions with P(yes) > {sweep['floor']:g}); each budget's yes precision is estimated from the sampled pairs it "
           f"would show. Chosen (highest yes precision with at least {sweep['min_active']:g} active questions a text and at most "
           f"{sweep['max_without']:g} of the texts with none, on at least {sweep.get('min_judged', 30)} judged pairs): **{best or 'none qualifies'}**.", ""]
    out += [markdown_table(["budget", "yes precision (est.)", "judged pairs shown", "mean active", "texts without active"],
                           [[("**" + r["budget"] + "**") if r["budget"] == best else r["budget"], figure(r["yes_precision"]),
                             str(r["judged"]), figure(r["mean_active"]), figure(r["texts_without_active_share"])] for r in rows]), ""]
    return out


def plot_sweep(sweep: dict, title: str) -> bytes:
    """Estimated yes precision against mean active questions a text: one curve per (rank, floor), points are k; the
    model's default budget as a star, the chosen one circled; PNG bytes."""
    from cqg_ray.evaluate.sweeps import agg_figure, png_bytes

    fig = agg_figure((7.5, 5))
    ax = fig.add_subplot(1, 1, 1)
    rows = sweep["rows"]
    curves: dict[str, list[dict]] = {}
    for r in rows[1:]:
        curves.setdefault(f"top-k by {rank_label(r)}, p > {r.get('floor')}", []).append(r)
    for label, rs in curves.items():
        rs = sorted(rs, key=lambda r: r["k"])
        x = [r["mean_active"] for r in rs]
        y = [np.nan if r["yes_precision"] is None else r["yes_precision"] for r in rs]
        ax.plot(x, y, marker="o", markersize=3, label=label)
        for r, xi, yi in zip(rs, x, y):
            if np.isfinite(yi):
                ax.annotate(str(r["k"]), (xi, yi), fontsize=6, xytext=(2, 2), textcoords="offset points")
    own = rows[0]
    if own["yes_precision"] is not None:
        ax.plot([own["mean_active"]], [own["yes_precision"]], marker="*", markersize=14, color="red", linestyle="none",
                label=f"model default ({own['budget']})")
    for r in rows:
        if r["budget"] == sweep.get("chosen") and r["yes_precision"] is not None:
            ax.plot([r["mean_active"]], [r["yes_precision"]], marker="o", markersize=14, markerfacecolor="none", color="black",
                    linestyle="none", label=f"chosen ({r['budget']})")
            break
    ax.axvline(sweep["min_active"], color="grey", linewidth=1, linestyle=":")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("mean active questions a text (log scale above 1)")
    ax.set_ylabel("judge's yes-rate on the shown questions (estimated)")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    return png_bytes(fig)
