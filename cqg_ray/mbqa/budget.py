"""The load budget: which questions a text answers yes, and the value each carries. The one place that decides.

    b = Budget(rule="top_k", k=112, floor=0.5, value="centred", rank="centred")
    mask, values = apply_budget(probs, b, mean)      # (n, m) bool, (n, m) float32 (zero outside the mask)

Rules:
- ``tau`` (the paper's Eq. 4): a question is active when p > tau. Every text gets as many as pass.
- ``top_k``: the k questions that rank highest, and of those only the ones with p > floor (so a text with few true
  properties shows few, and every active question is one the text answers yes). ``rank``: ``prob`` ranks by p (the
  most confident questions), ``centred`` by p minus the question's mean (the questions this text answers yes more
  surely than texts usually do: the ones that tell it apart), ``lift`` by p minus ``lift`` times the mean among the
  questions above the floor (0 < lift <= 1: a text's sure questions, the ones most texts share pushed back; it still
  shows k where k pass the floor, where ``centred`` ranks first and so shows fewer). The explanation of two texts is at
  most k long.

Values (what the vector holds on the active questions; zero elsewhere):
- ``one``: 1 (a binary vector, Eq. 4's y_i);
- ``prob``: p;
- ``centred``: p minus the question's mean probability on the training corpus (``mean``, stored in the model folder
  as ``stats.safetensors``), so a question almost every text answers yes weighs little.

``apply_budget`` is pure numpy and the reference; ``cqg_ray.mbqa.budget_torch`` applies the same rule in torch, chunk by
chunk, where the heads run (the same outputs on CPU tensors, ties included: at the k-th place the lower question index
wins). ``InterpretableEmbedder`` holds the model's default ``Budget`` (its ``config.json``) and every surface (encode,
explain, search, serve, embed, evaluate, faithfulness) calls it through the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

RULES = ("tau", "top_k")
VALUES = ("one", "prob", "centred")
RANKS = ("prob", "centred", "lift")


@dataclass(frozen=True)
class Budget:
    """A rule that picks each text's active questions, and the value an active question carries."""

    rule: str = "tau"
    tau: float = 0.5             # rule tau: active when p > tau
    k: int = 64                  # rule top_k: at most k active questions per text
    floor: float | None = 0.5    # rule top_k: and only those with p > floor (None: no floor)
    value: str = "one"           # one | prob | centred
    rank: str = "prob"           # rule top_k: rank by prob (p), centred (p - mean) or lift (p - lift * mean above the floor)
    lift: float = 0.5            # rank lift: the share of the mean taken off

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"budget rule must be one of {', '.join(RULES)}; got {self.rule!r}")
        if self.value not in VALUES:
            raise ValueError(f"budget value must be one of {', '.join(VALUES)}; got {self.value!r}")
        if self.rank not in RANKS:
            raise ValueError(f"budget rank must be one of {', '.join(RANKS)}; got {self.rank!r}")
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not 0 < self.tau < 1:
            raise ValueError(f"budget tau must lie in (0, 1), got {self.tau!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"budget k must be an integer >= 1, got {self.k!r}")
        if self.floor is not None and (isinstance(self.floor, bool) or not isinstance(self.floor, (int, float)) or not 0 <= self.floor < 1):
            raise ValueError(f"budget floor must lie in [0, 1) or be null, got {self.floor!r}")
        if isinstance(self.lift, bool) or not isinstance(self.lift, (int, float)) or not 0 < self.lift <= 1:
            raise ValueError(f"budget lift must lie in (0, 1], got {self.lift!r}")

    @property
    def name(self) -> str:
        """A short label: ``tau=0.76``, ``top64>0.5 prob``, ``top112>0.5 centred by p-mean``, ``top12>0.6 prob by p-0.5mean``."""
        if self.rule == "tau":
            base = f"tau={self.tau:g}"
        else:
            base = f"top{self.k}" + (f">{self.floor:g}" if self.floor is not None else "")
        base = base if self.value == "one" else f"{base} {self.value}"
        if self.rule != "top_k" or self.rank == "prob":
            return base
        return base + (" by p-mean" if self.rank == "centred" else f" by p-{self.lift:g}mean")

    def name_for(self, m: int) -> str:
        """``name`` as applied to m questions: a k above m reads as m (``top112`` on 23 questions is ``top23``)."""
        return self.with_(k=m).name if self.rule == "top_k" and self.k > m >= 1 else self.name

    def to_dict(self) -> dict[str, Any]:
        if self.rule == "tau":
            return {"rule": "tau", "tau": self.tau, "value": self.value}
        lift = {"lift": self.lift} if self.rank == "lift" else {}  # only where it is used: other budgets' dicts stay as they were
        return {"rule": "top_k", "k": self.k, "floor": self.floor, "value": self.value, "rank": self.rank, **lift}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Budget":
        unknown = set(d) - {f for f in asdict(cls())}
        if unknown:
            raise ValueError(f"unknown budget keys {sorted(unknown)} (known: rule, tau, k, floor, value, rank, lift)")
        return cls(**d)

    @property
    def needs_mean(self) -> bool:
        """Whether applying it needs the questions' mean probabilities (centred values, or ranking by p - mean or lift)."""
        return self.value == "centred" or (self.rule == "top_k" and self.rank != "prob")

    def with_(self, **changes) -> "Budget":
        """A copy with some fields changed, checked like a new one (``ValueError``, also for a change the resulting rule
        would not use: ``k`` for the tau rule, ``tau`` for top_k, ``lift`` for another rank); the fields it does not use
        go back to their defaults (``rule="tau"`` drops k, floor, rank and lift; ``rule="top_k"`` drops tau; a rank other
        than lift drops lift)."""
        rule = changes.get("rule", self.rule)
        unused = [k for k in changes if (k in ("k", "floor", "rank", "lift") if rule == "tau" else k == "tau")
                  or (k == "lift" and rule == "top_k" and changes.get("rank", self.rank) != "lift")]
        if unused:
            why = ("the tau rule uses tau and value" if rule == "tau" else "the top_k rule's threshold is floor" if unused[0] == "tau"
                   else "it applies to rank lift only")
            raise ValueError(f"budget {', '.join(unused)} would not be used: {why}")
        d = {**self.to_dict(), **changes}
        for key in ("tau",) if d.get("rule") == "top_k" else ("k", "floor", "rank", "lift"):
            d.pop(key, None)
        if d.get("rank") != "lift":
            d.pop("lift", None)
        return Budget.from_dict(d)


def active_mask(probs: np.ndarray, budget: Budget, mean: np.ndarray | None = None) -> np.ndarray:
    """(n, m) bool: the questions each row of ``probs`` answers yes under ``budget`` (a 1-d row gives (m,));
    ``mean`` (m,): needed to rank by p - mean or by lift."""
    p = np.asarray(probs)
    one = p.ndim == 1
    p = np.atleast_2d(p)
    if budget.rule == "tau":
        mask = p > budget.tau
    else:
        n, m = p.shape
        if budget.k >= m:
            mask = np.ones_like(p, dtype=bool)
        else:
            mask = top_k_mask(rank_score(p, budget, mean), budget.k)
        if budget.floor is not None:
            mask &= p > budget.floor
    return mask[0] if one else mask


def rank_score(p: np.ndarray, budget: Budget, mean: np.ndarray | None) -> np.ndarray:
    """(n, m): what the top_k rule ranks by: p, p - mean, or p - lift * mean with the questions at or below the floor
    last (-inf)."""
    if budget.rank == "prob":
        return p
    m = p.shape[1]
    if budget.rank == "centred":
        return p - _check_mean(mean, m, "rank by p - mean")
    score = p - np.float32(budget.lift) * _check_mean(mean, m, "rank by lift")
    return score if budget.floor is None else np.where(p > budget.floor, score, -np.inf).astype(score.dtype, copy=False)


def top_k_mask(score: np.ndarray, k: int) -> np.ndarray:
    """(n, m) bool: each row's k highest scores (1 <= k < m); of equal scores at the k-th place the lower question
    index wins (``cqg_ray.mbqa.budget_torch`` follows the same rule)."""
    kth = -np.partition(-score, k - 1, axis=1)[:, k - 1 : k]  # each row's k-th highest score
    above = score > kth
    at = score == kth
    mask = above | at
    need = k - above.sum(axis=1)
    tied = np.flatnonzero(at.sum(axis=1) > need)  # rows where more scores equal the k-th than places are left
    if len(tied):
        mask[tied] = above[tied] | (at[tied] & (np.cumsum(at[tied], axis=1) <= need[tied, None]))
    return mask


def apply_budget(probs: np.ndarray, budget: Budget, mean: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mask bool, values float32) of ``probs`` (n, m) under ``budget``; values are zero outside the mask.
    ``mean``: (m,) the questions' mean probabilities on the training corpus (needed for value "centred")."""
    p = np.asarray(probs, dtype=np.float32)
    mask = active_mask(p, budget, mean)
    values = np.zeros(p.shape, dtype=np.float32)
    values[mask] = _active_values(p[mask], np.nonzero(mask)[-1], budget, mean, p.shape[-1])
    return mask, values


def sparse_budget(probs: np.ndarray, budget: Budget, mean: np.ndarray | None = None):
    """``apply_budget``'s values as a ``scipy.sparse.csr_array`` (n, m) float32, built from the active positions alone
    (no dense value matrix); a value that is exactly 0 is kept as an explicit entry."""
    import scipy.sparse as sp

    p = np.atleast_2d(np.asarray(probs, dtype=np.float32))
    mask = active_mask(p, budget, mean)
    rows, cols = np.nonzero(mask)
    data = _active_values(p[rows, cols], cols, budget, mean, p.shape[-1])
    indptr = np.zeros(len(p) + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=indptr[1:])
    return sp.csr_array((data, cols.astype(np.int32), indptr), shape=p.shape)


def _active_values(p: np.ndarray, cols: np.ndarray, budget: Budget, mean: np.ndarray | None, m: int) -> np.ndarray:
    """The values of the active entries (float32): ``p`` their probabilities, ``cols`` their questions."""
    if budget.value == "one":
        return np.ones(len(p), dtype=np.float32)
    if budget.value == "prob":
        return p.astype(np.float32, copy=False)
    return p - _check_mean(mean, m, "value 'centred'")[cols]


def _check_mean(mean: np.ndarray | None, m: int, what: str) -> np.ndarray:
    if mean is None:
        raise ValueError(f"budget {what} needs the questions' mean probabilities (the model's stats.safetensors)")
    mean = np.asarray(mean, dtype=np.float32)
    if mean.shape != (m,):
        raise ValueError(f"mean must have shape ({m},), got {mean.shape}")
    return mean
