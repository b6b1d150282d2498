"""What evaluation needs from a model, as two small protocols, so that any object with the right methods works.

- ``Encoder``: ``encode(texts) -> (n, d)`` array (dense float, binary 0/1, or a scipy sparse matrix).
  The baselines (dense encoder, Bag-of-Tokens) and anything else a user wants compared are Encoders.
- ``InterpretableModel``: CQG-MBQA's ``InterpretableEmbedder`` (``cqg_ray.mbqa.embedder``):
  ``encode(texts, output="probs")`` gives the probabilities sigma(C_i(e)) of the m questions (float32, (n, m));
  ``apply(probs, budget=None)`` gives (active, values) under its budget (a model without ``apply`` is read as the
  paper's rule at its ``tau``); ``questions`` its m questions; ``encoder`` its frozen sentence encoder.
  Evaluation asks for the probabilities once per text set and applies the budgets itself, so the sweeps never
  encode twice.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    def encode(self, texts: list[str]) -> Any: ...


@runtime_checkable
class InterpretableModel(Protocol):
    tau: float
    questions: Any

    def encode(self, texts: list[str], output: str = "bits", threshold: float | None = None) -> np.ndarray: ...


def load_model(model_or_path: Any) -> Any:
    """A model object as given, or ``InterpretableEmbedder.load(path)`` for a path (local or URI)."""
    if isinstance(model_or_path, (str, os.PathLike)):
        from cqg_ray.mbqa.embedder import InterpretableEmbedder

        return InterpretableEmbedder.load(str(model_or_path))
    return model_or_path


def is_interpretable(model: Any) -> bool:
    return hasattr(model, "tau") and hasattr(model, "questions") and hasattr(model, "encode")


def probabilities(model: Any, texts: list[str]) -> np.ndarray:
    """(n, m) float32 probabilities sigma(C_i(e)) of an interpretable model."""
    p = np.asarray(model.encode(list(texts), output="probs"), dtype=np.float32)
    if p.ndim != 2 or p.shape[0] != len(texts):
        raise ValueError(f"model.encode(output='probs') returned shape {p.shape} for {len(texts)} texts")
    return p


def model_budget(model: Any):
    """The model's default ``Budget`` (a model without one: the paper's tau rule at its ``tau``)."""
    from cqg_ray.mbqa.budget import Budget

    return getattr(model, "budget", None) or Budget(rule="tau", tau=float(model.tau))


def budgeted(model: Any, probs: np.ndarray, budget: Any = None) -> np.ndarray:
    """(n, m) float32: the vectors the model's ``encode(output="sparse")`` gives for these probabilities, dense (the
    budget's values on the active questions, zero elsewhere); ``budget``: another ``Budget`` (default the model's)."""
    if hasattr(model, "apply"):
        return model.apply(probs, budget)[1]
    from cqg_ray.mbqa.budget import apply_budget

    return apply_budget(probs, budget or model_budget(model))[1]


def model_name(model: Any, default: str = "CQG-MBQA") -> str:
    return str(getattr(model, "name", None) or default)
