"""Explanations (cqg_ray.explain): the rule for yes, the binary cosine, shared and differing questions, the text form."""

import numpy as np
import pytest

from cqg_ray.explain import active, binary_cosine, explanation, format_explanation


def test_active_is_p_above_tau():
    assert active(np.array([0.5, 0.51, 0.2, 0.9]), 0.5).tolist() == [False, True, False, True]


def test_binary_cosine():
    assert binary_cosine([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert binary_cosine([0, 0], [1, 1]) == 0.0


def test_explanation_of_two_probability_vectors():
    p_a = np.array([0.9, 0.8, 0.1, 0.6, 0.2])
    p_b = np.array([0.7, 0.3, 0.9, 0.55, 0.1])
    questions = [{"id": f"q{i}", "text": f"Q{i}?"} for i in range(4)] + [{"text": "no id?"}]
    ex = explanation(p_a, p_b, 0.5, questions)
    assert [q.index for q in ex.shared_yes] == [0, 3] and ex.cognitive_load == 2
    assert [q.index for q in ex.only_a] == [1] and [q.index for q in ex.only_b] == [2]
    assert (ex.yes_a, ex.yes_b, ex.tau) == (3, 3, 0.5)
    assert ex.cosine == pytest.approx(2 / 3)
    assert ex.shared_yes[0] == ex.shared_yes[0].__class__(0, "q0", "Q0?", 0.9, 0.7, True, True)
    assert ex.only_b[0].a is False and ex.only_b[0].b is True
    assert [q.index for q in ex.differing] == [1, 2]
    low = explanation(p_a, p_b, 0.15, questions)
    assert [q.index for q in low.shared_yes] == [0, 1, 3] and low.only_a[0].id == "4"  # a record without an id: its index
    assert ex.to_dict()["shared_yes"][1] == {"index": 3, "id": "q3", "text": "Q3?", "p_a": 0.6, "p_b": 0.55, "a": True, "b": True}


def test_format_explanation_lists_shared_then_differing_questions():
    p_a = np.array([0.9, 0.8, 0.1])
    p_b = np.array([0.7, 0.3, 0.9])
    ex = explanation(p_a, p_b, 0.5, [{"id": "a", "text": "Q0?"}, {"id": "b", "text": "Q1?"}, {"id": "c", "text": "Q2?"}])
    assert format_explanation(ex, "one", "two").splitlines() == [
        "Text A: one",
        "Text B: two",
        "cosine similarity (binary, tau=0.5): 0.500   cognitive load (questions both answer yes): 1",
        "  both yes:",
        "    [   a] Q0?  (A 0.90, B 0.70)",
        "  only A yes:",
        "    [   b] Q1?  (A 0.80, B 0.30)",
        "  only B yes:",
        "    [   c] Q2?  (A 0.10, B 0.90)",
    ]
