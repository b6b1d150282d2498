"""Explanations (cqg_ray.explain): the cosines, shared and differing questions under a budget, the text form."""

import numpy as np
import pytest

from cqg_ray.explain import binary_cosine, explanation, format_explanation, value_cosine
from cqg_ray.mbqa.budget import Budget, apply_budget


def explain_at(p_a, p_b, budget, questions, mean=None):
    (ya, yb), (va, vb) = apply_budget(np.stack([p_a, p_b]), budget, mean)
    return explanation(p_a, p_b, ya, yb, va, vb, questions, budget.name)


def test_value_cosine():
    assert value_cosine([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert value_cosine([0.3, -0.4], [0.3, -0.4]) == pytest.approx(1.0)
    assert value_cosine([0, 0], [1, 1]) == 0.0
    import numpy as np

    rng = np.random.default_rng(0)
    v = [rng.random(rng.integers(1, 300)) for _ in range(8)][-1]  # 57 values whose own cosine rounds above 1
    assert v @ v / np.linalg.norm(v) ** 2 > 1 and value_cosine(v, v) == 1.0


def test_binary_cosine():
    assert binary_cosine([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert binary_cosine([0, 0], [1, 1]) == 0.0


def test_explanation_of_two_probability_vectors():
    p_a = np.array([0.9, 0.8, 0.1, 0.6, 0.2])
    p_b = np.array([0.7, 0.3, 0.9, 0.55, 0.1])
    questions = [{"id": f"q{i}", "text": f"Q{i}?"} for i in range(4)] + [{"text": "no id?"}]
    ex = explain_at(p_a, p_b, Budget(rule="tau", tau=0.5), questions)
    assert [q.index for q in ex.shared_yes] == [0, 3] and ex.cognitive_load == 2
    assert [q.index for q in ex.only_a] == [1] and [q.index for q in ex.only_b] == [2]
    assert (ex.yes_a, ex.yes_b, ex.budget) == (3, 3, "tau=0.5")
    assert ex.cosine == pytest.approx(2 / 3)
    assert ex.shared_yes[0] == ex.shared_yes[0].__class__(0, "q0", "Q0?", 0.9, 0.7, True, True)
    assert ex.only_b[0].a is False and ex.only_b[0].b is True
    assert [q.index for q in ex.differing] == [1, 2]
    low = explain_at(p_a, p_b, Budget(rule="tau", tau=0.15), questions)
    assert [q.index for q in low.shared_yes] == [0, 3, 1] and low.only_a[0].id == "4"  # ranked by p_a * p_b; no id: its index
    assert ex.to_dict()["shared_yes"][1] == {"index": 3, "id": "q3", "text": "Q3?", "p_a": 0.6, "p_b": 0.55, "a": True, "b": True,
                                             "precision": None, "n_heldout": None}  # a model without reliability figures


def test_a_top_k_budget_with_centred_values():
    p_a = np.array([0.9, 0.8, 0.7, 0.6, 0.2], dtype=np.float32)
    p_b = np.array([0.95, 0.1, 0.75, 0.9, 0.3], dtype=np.float32)
    mean = np.array([0.5, 0.5, 0.5, 0.5, 0.5], dtype=np.float32)
    questions = [{"id": f"q{i}", "text": f"Q{i}?"} for i in range(5)]
    ex = explain_at(p_a, p_b, Budget(rule="top_k", k=2, floor=0.5, value="centred"), questions, mean)
    # A: q0, q1 (its two surest); B: q0, q3
    assert [q.index for q in ex.shared_yes] == [0] and ex.cognitive_load == 1
    assert [q.index for q in ex.only_a] == [1] and [q.index for q in ex.only_b] == [3]
    va, vb = np.array([0.4, 0.3, 0, 0, 0]), np.array([0.45, 0, 0, 0.4, 0])
    assert ex.cosine == pytest.approx(value_cosine(va, vb), rel=1e-5) and ex.budget == "top2>0.5 centred"


def test_format_explanation_lists_shared_then_differing_questions():
    p_a = np.array([0.9, 0.8, 0.1])
    p_b = np.array([0.7, 0.3, 0.9])
    ex = explain_at(p_a, p_b, Budget(rule="tau", tau=0.5), [{"id": "a", "text": "Q0?"}, {"id": "b", "text": "Q1?"}, {"id": "c", "text": "Q2?"}])
    assert format_explanation(ex, "one", "two").splitlines() == [
        "Text A: one",
        "Text B: two",
        "cosine similarity (tau=0.5): 0.500   cognitive load (questions both answer yes): 1",
        "  both yes:",
        "    [   a] Q0?  (A 0.90, B 0.70)",
        "  only A yes:",
        "    [   b] Q1?  (A 0.80, B 0.30)",
        "  only B yes:",
        "    [   c] Q2?  (A 0.10, B 0.90)",
    ]


def test_each_question_carries_its_measured_precision():
    """The records' precision and n_heldout reach every item and the text form: a measured one, an unmeasured one (too
    few held-out labels) and one from a model that stores no figures."""
    p_a, p_b = np.array([0.9, 0.8, 0.1]), np.array([0.7, 0.3, 0.9])
    questions = [{"id": "a", "text": "Q0?", "precision": 0.8333, "n_heldout": 12}, {"id": "b", "text": "Q1?", "precision": None, "n_heldout": 3},
                 {"id": "c", "text": "Q2?"}]
    ex = explain_at(p_a, p_b, Budget(rule="tau", tau=0.5), questions)
    assert [(q.precision, q.n_heldout) for q in ex.shared_yes + ex.only_a + ex.only_b] == [(0.8333, 12), (None, 3), (None, None)]
    assert format_explanation(ex, "one", "two").splitlines()[3:] == [
        "  both yes:",
        "    [   a] Q0?  (A 0.90, B 0.70, labeller precision 0.83, 12 held-out labels)",
        "  only A yes:",
        "    [   b] Q1?  (A 0.80, B 0.30, labeller precision unmeasured, 3 held-out labels)",
        "  only B yes:",
        "    [   c] Q2?  (A 0.10, B 0.90)",
    ]
