"""Explanations: why two texts are close, in the questions they answer alike. The one place that builds them.

    ex = model.explanation(p_a, p_b)        # two probability vectors (m,) under the model's budget
    ex.shared_yes, ex.cognitive_load, ex.only_a, ex.only_b, ex.cosine
    print(format_explanation(ex, text_a, text_b))

``InterpretableEmbedder.explain``, ``cqg-ray search``, the Serve app's ``/explain`` and the faithfulness task
(``cqg_ray.evaluate.faithfulness``) all come here, so what is measured is what a user reads. Which questions a text
answers yes is the model's budget (``cqg_ray.mbqa.budget``); ``explanation`` takes its masks and values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cqg_ray.texts import clipped


def binary_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two 0/1 vectors: |a AND b| / sqrt(|a| |b|), 0 when either is all zeros."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    na, nb = int(a.sum()), int(b.sum())
    return min(1.0, float(np.count_nonzero(a & b) / np.sqrt(na * nb))) if na and nb else 0.0


@dataclass
class AnsweredQuestion:
    """One question of an explanation, with both texts' probabilities and answers, and how far the question's head
    agrees with the labelling LLM on held-out texts: ``precision`` (None: too few held-out labels to say) out of
    ``n_heldout`` labels (None: a model that stores no such figures)."""

    index: int
    id: str
    text: str
    p_a: float
    p_b: float
    a: bool
    b: bool
    precision: float | None = None
    n_heldout: int | None = None


@dataclass
class Explanation:
    """Why two texts are similar: the questions both answer yes (their count is the cognitive load), ranked by
    p_a * p_b, the questions only one answers yes, and the cosine similarity of their budgeted vectors."""

    cosine: float
    cognitive_load: int
    shared_yes: list[AnsweredQuestion] = field(default_factory=list)
    only_a: list[AnsweredQuestion] = field(default_factory=list)  # yes for text a, no for text b
    only_b: list[AnsweredQuestion] = field(default_factory=list)  # no for text a, yes for text b
    budget: str = "tau=0.5"  # the rule that made the answers (``Budget.name``)
    yes_a: int = 0  # questions text a answers yes
    yes_b: int = 0

    @property
    def differing(self) -> list[AnsweredQuestion]:
        return self.only_a + self.only_b

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:  # print(ex): the lines `cqg-ray explain` prints, without the texts
        return format_explanation(self)


def value_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two value vectors, 0 when either is all zeros (for 0/1 vectors it is ``binary_cosine``)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return min(1.0, max(-1.0, float(a @ b / (na * nb)))) if na and nb else 0.0  # rounding could pass 1


def explanation(p_a: np.ndarray, p_b: np.ndarray, ya: np.ndarray, yb: np.ndarray, va: np.ndarray, vb: np.ndarray,
                questions: list[dict], budget: str) -> Explanation:
    """The explanation of two texts from their probabilities (m,), their active questions ``ya``/``yb`` (bool) and
    values ``va``/``vb`` under a budget (``InterpretableEmbedder.apply``); ``questions``: the model's question
    records (``text``, optional ``id``) in dimension order; ``budget``: the rule's name."""
    ya, yb = np.asarray(ya, dtype=bool), np.asarray(yb, dtype=bool)
    p_a, p_b = np.asarray(p_a), np.asarray(p_b)

    def qa(i: int) -> AnsweredQuestion:
        rec = questions[i]
        n = rec.get("n_heldout")
        return AnsweredQuestion(int(i), str(rec.get("id", i)), rec["text"], float(p_a[i]), float(p_b[i]), bool(ya[i]), bool(yb[i]),
                                rec.get("precision"), None if n is None else int(n))

    def ranked(idx: np.ndarray, score: np.ndarray) -> list[AnsweredQuestion]:
        return [qa(i) for i in idx[np.argsort(-score[idx], kind="stable")]]

    return Explanation(cosine=value_cosine(va, vb), cognitive_load=int(np.count_nonzero(ya & yb)),
                       shared_yes=ranked(np.flatnonzero(ya & yb), p_a * p_b), only_a=ranked(np.flatnonzero(ya & ~yb), p_a),
                       only_b=ranked(np.flatnonzero(~ya & yb), p_b), budget=budget, yes_a=int(ya.sum()), yes_b=int(yb.sum()))


def reliability_note(precision: float | None, n_heldout: int | None) -> str:
    """"labeller precision 0.83, 12 held-out labels" / "labeller precision unmeasured, 3 held-out labels" / "" (a
    model without the figures): agreement with the labelling LLM, named so that it is not read as the truth."""
    if n_heldout is None:
        return ""
    if precision is None:
        return f"labeller precision unmeasured, {n_heldout} held-out labels"
    return f"labeller precision {precision:.2f}, {n_heldout} held-out labels"


def format_explanation(ex: Explanation, text_a: str | None = None, text_b: str | None = None, max_rows: int = 8) -> str:
    """An explanation as plain lines: both texts (where given), cosine and load, then the shared and differing questions."""
    lines = [f"Text A: {clipped(text_a, 200)}", f"Text B: {clipped(text_b, 200)}"] if text_a is not None and text_b is not None else []
    lines += [f"cosine similarity ({ex.budget}): {ex.cosine:.3f}   cognitive load (questions both answer yes): {ex.cognitive_load}"]
    for label, items in (("both yes", ex.shared_yes), ("only A yes", ex.only_a), ("only B yes", ex.only_b)):
        if items:
            lines.append(f"  {label}:")
            for q in items[:max_rows]:
                note = reliability_note(q.precision, q.n_heldout)
                lines.append(f"    [{q.id:>4}] {q.text}  (A {q.p_a:.2f}, B {q.p_b:.2f}{', ' + note if note else ''})")
            if len(items) > max_rows:
                lines.append(f"    ... and {len(items) - max_rows} more")
    return "\n".join(lines)
