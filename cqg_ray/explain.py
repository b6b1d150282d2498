"""Explanations: why two texts are close, in the questions they answer alike. The one place that builds them.

    ex = explanation(p_a, p_b, tau, model.question_records)    # from two probability vectors (m,)
    ex.shared_yes, ex.cognitive_load, ex.only_a, ex.only_b, ex.cosine
    print(format_explanation(ex, text_a, text_b))

``InterpretableEmbedder.explain``, ``cqg-ray search``, the Serve app's ``/explain`` and the faithfulness task
(``cqg_ray.evaluate.faithfulness``) all come here, so what is measured is what a user reads. ``active`` is the rule
that says which questions a text answers yes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


def active(probs: np.ndarray, tau: float) -> np.ndarray:
    """The questions a text answers yes (bool, same shape as ``probs``): p > tau (paper Eq. 4)."""
    return np.asarray(probs) > tau


def binary_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two 0/1 vectors: |a AND b| / sqrt(|a| |b|), 0 when either is all zeros."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    na, nb = int(a.sum()), int(b.sum())
    return float(np.count_nonzero(a & b) / np.sqrt(na * nb)) if na and nb else 0.0


@dataclass
class AnsweredQuestion:
    """One question of an explanation, with both texts' probabilities and answers."""

    index: int
    id: str
    text: str
    p_a: float
    p_b: float
    a: bool
    b: bool


@dataclass
class Explanation:
    """Why two texts are similar: the questions both answer yes (their count is the cognitive load),
    the questions they answer differently, and the cosine similarity of their binary vectors."""

    cosine: float
    cognitive_load: int
    shared_yes: list[AnsweredQuestion] = field(default_factory=list)
    only_a: list[AnsweredQuestion] = field(default_factory=list)  # yes for text a, no for text b
    only_b: list[AnsweredQuestion] = field(default_factory=list)  # no for text a, yes for text b
    tau: float = 0.5
    yes_a: int = 0  # questions text a answers yes
    yes_b: int = 0

    @property
    def differing(self) -> list[AnsweredQuestion]:
        return self.only_a + self.only_b

    def to_dict(self) -> dict:
        return asdict(self)


def explanation(p_a: np.ndarray, p_b: np.ndarray, tau: float, questions: list[dict]) -> Explanation:
    """The explanation of two texts from their probabilities (m,) at threshold tau; ``questions``: the model's
    question records (``text``, optional ``id``) in dimension order."""
    ya, yb = active(p_a, tau), active(p_b, tau)

    def qa(i: int) -> AnsweredQuestion:
        rec = questions[i]
        return AnsweredQuestion(int(i), str(rec.get("id", i)), rec["text"], float(p_a[i]), float(p_b[i]), bool(ya[i]), bool(yb[i]))

    shared = [qa(i) for i in np.flatnonzero(ya & yb)]
    return Explanation(cosine=binary_cosine(ya, yb), cognitive_load=len(shared), shared_yes=shared,
                       only_a=[qa(i) for i in np.flatnonzero(ya & ~yb)], only_b=[qa(i) for i in np.flatnonzero(~ya & yb)],
                       tau=tau, yes_a=int(ya.sum()), yes_b=int(yb.sum()))


def format_explanation(ex: Explanation, text_a: str, text_b: str, max_rows: int = 8) -> str:
    """An explanation as plain lines: both texts, cosine and load, then the shared and differing questions."""
    lines = [f"Text A: {text_a}", f"Text B: {text_b}",
             f"cosine similarity (binary, tau={ex.tau}): {ex.cosine:.3f}   cognitive load (questions both answer yes): {ex.cognitive_load}"]
    for label, items in (("both yes", ex.shared_yes), ("only A yes", ex.only_a), ("only B yes", ex.only_b)):
        if items:
            lines.append(f"  {label}:")
            for q in items[:max_rows]:
                lines.append(f"    [{q.id:>4}] {q.text}  (A {q.p_a:.2f}, B {q.p_b:.2f})")
            if len(items) > max_rows:
                lines.append(f"    ... and {len(items) - max_rows} more")
    return "\n".join(lines)
