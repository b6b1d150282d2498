"""The load budget's pure core: which questions are active and their values, on crafted probabilities."""

import numpy as np
import pytest

from cqg_ray.mbqa.budget import Budget, active_mask, apply_budget

P = np.array([
    [0.90, 0.20, 0.60, 0.55, 0.10],
    [0.10, 0.30, 0.20, 0.40, 0.45],   # no question above 0.5
    [0.99, 0.98, 0.97, 0.96, 0.95],
], dtype=np.float32)
MEAN = np.array([0.5, 0.1, 0.5, 0.2, 0.9], dtype=np.float32)


def test_top_k_without_a_floor_keeps_the_k_most_confident():
    mask = active_mask(P, Budget(rule="top_k", k=2, floor=None))
    assert mask.tolist() == [[True, False, True, False, False],
                             [False, False, False, True, True],
                             [True, True, False, False, False]]


def test_top_k_with_a_floor_shows_few_for_a_text_with_few_properties():
    mask = active_mask(P, Budget(rule="top_k", k=3, floor=0.5))
    assert mask.tolist() == [[True, False, True, True, False],
                             [False, False, False, False, False],
                             [True, True, True, False, False]]
    assert mask.sum(axis=1).tolist() == [3, 0, 3]


def test_k_at_least_m_keeps_everything_above_the_floor():
    assert active_mask(P, Budget(rule="top_k", k=9, floor=None)).all()
    assert active_mask(P, Budget(rule="top_k", k=5, floor=0.5)).sum() == 3 + 0 + 5


def test_the_tau_rule_is_the_papers_eq_4():
    assert np.array_equal(active_mask(P, Budget(rule="tau", tau=0.58)), P > 0.58)
    mask, values = apply_budget(P, Budget(rule="tau", tau=0.58))
    assert values.dtype == np.float32 and np.array_equal(values, (P > 0.58).astype(np.float32))


def test_values_prob_and_centred_are_zero_outside_the_mask():
    b = Budget(rule="top_k", k=2, floor=None, value="prob")
    mask, values = apply_budget(P, b)
    assert values[0].tolist() == pytest.approx([0.9, 0, 0.6, 0, 0])
    _, centred = apply_budget(P, Budget(rule="top_k", k=2, floor=None, value="centred"), MEAN)
    assert centred[0].tolist() == pytest.approx([0.4, 0, 0.1, 0, 0])
    assert centred[1].tolist() == pytest.approx([0, 0, 0, 0.2, -0.45])
    with pytest.raises(ValueError, match="mean probabilities"):
        apply_budget(P, Budget(rule="top_k", k=2, value="centred"))
    with pytest.raises(ValueError, match="shape"):
        apply_budget(P, Budget(rule="top_k", k=2, value="centred"), MEAN[:3])


def test_one_row_gives_one_row():
    assert active_mask(P[0], Budget(rule="top_k", k=1, floor=None)).tolist() == [True, False, False, False, False]


def test_names_dicts_and_checks():
    b = Budget(rule="top_k", k=64, floor=0.5, value="centred")
    assert b.name == "top64>0.5 centred"
    assert Budget(rule="tau", tau=0.76).name == "tau=0.76"
    assert Budget(rule="top_k", k=8, floor=None, value="prob").name == "top8 prob"
    # as applied to m questions: a k above m reads as m (the demo's 112 on 23 questions), the others unchanged
    top112 = Budget(rule="top_k", k=112, floor=0.5, value="centred", rank="centred")
    assert (top112.name_for(23), top112.name_for(112), top112.name_for(200)) == (
        "top23>0.5 centred by p-mean", "top112>0.5 centred by p-mean", "top112>0.5 centred by p-mean")
    assert Budget(rule="tau", tau=0.76).name_for(3) == "tau=0.76"
    assert b.to_dict() == {"rule": "top_k", "k": 64, "floor": 0.5, "value": "centred", "rank": "prob"}
    assert Budget.from_dict(b.to_dict()) == b
    assert Budget.from_dict({"rule": "tau", "tau": 0.7, "value": "one"}) == Budget(rule="tau", tau=0.7)
    for bad, match in (({"rule": "top"}, "rule"), ({"k": 0}, "k must"), ({"k": 2.5}, "k must"), ({"tau": 1.0}, "tau"),
                       ({"floor": -0.1}, "floor"), ({"value": "bits"}, "value"), ({"kk": 3}, "unknown")):
        with pytest.raises(ValueError, match=match):
            Budget.from_dict(bad)


def test_rank_by_p_minus_mean_picks_the_questions_that_set_a_text_apart():
    b = Budget(rule="top_k", k=2, floor=0.5, value="centred", rank="centred")
    mask, values = apply_budget(P, b, MEAN)
    # row 0: p - mean = [0.4, 0.1, 0.1, 0.35, -0.8] -> q0, q3 (q2 ranks third though its p is higher than q3's)
    # row 2: [0.49, 0.88, 0.47, 0.76, 0.05] -> q1, q3
    assert mask.tolist() == [[True, False, False, True, False], [False] * 5, [False, True, False, True, False]]
    assert values[0].tolist() == pytest.approx([0.4, 0, 0, 0.35, 0])
    assert b.name == "top2>0.5 centred by p-mean" and Budget.from_dict(b.to_dict()) == b
    with pytest.raises(ValueError, match="rank by p - mean needs"):
        active_mask(P, Budget(rule="top_k", k=2, rank="centred"))
    with pytest.raises(ValueError, match="rank"):
        Budget(rule="top_k", k=2, rank="mean")


def test_rank_by_lift_ranks_the_questions_above_the_floor_by_p_minus_a_share_of_the_mean():
    b = Budget(rule="top_k", k=2, floor=0.5, value="prob", rank="lift", lift=0.5)
    mask, values = apply_budget(P, b, MEAN)
    # row 0: above the floor q0, q2, q3; p - 0.5 mean = 0.65, 0.35, 0.45 -> q0, q3 (by p alone: q0, q2)
    # row 2: p - 0.5 mean = [0.74, 0.93, 0.72, 0.86, 0.50] -> q1, q3
    assert mask.tolist() == [[True, False, False, True, False], [False] * 5, [False, True, False, True, False]]
    assert values[0].tolist() == pytest.approx([0.9, 0, 0, 0.55, 0])
    # centred ranks before the floor, so a question below it can take a place: p - mean = [0.30, 0.35, 0.15, -0.1, -0.8]
    # puts q1 (p 0.45) second and shows q0 alone; lift 1 ranks among q0 and q2 and shows both
    row = np.array([[0.80, 0.45, 0.65, 0.10, 0.10]], dtype=np.float32)
    assert active_mask(row, Budget(rule="top_k", k=2, floor=0.5, rank="centred"), MEAN).tolist() == [[True, False, False, False, False]]
    assert active_mask(row, Budget(rule="top_k", k=2, floor=0.5, rank="lift", lift=1.0), MEAN).tolist() == [[True, False, True, False, False]]
    # without a floor it ranks every question
    assert active_mask(row, Budget(rule="top_k", k=2, floor=None, rank="lift", lift=1.0), MEAN).tolist() == [[True, True, False, False, False]]
    assert b.name == "top2>0.5 prob by p-0.5mean" and b.needs_mean
    assert b.to_dict() == {"rule": "top_k", "k": 2, "floor": 0.5, "value": "prob", "rank": "lift", "lift": 0.5}
    assert Budget.from_dict(b.to_dict()) == b and Budget.from_dict(b.to_dict()).lift == 0.5
    assert b.with_(rank="prob").to_dict() == {"rule": "top_k", "k": 2, "floor": 0.5, "value": "prob", "rank": "prob"}
    assert b.with_(k=3) == Budget(rule="top_k", k=3, floor=0.5, value="prob", rank="lift", lift=0.5)
    assert b.with_(rule="tau").to_dict() == {"rule": "tau", "tau": 0.5, "value": "prob"}
    # a change the resulting rule would not use is refused, not dropped
    for change, says in (({"tau": 0.9}, "budget tau would not be used: the top_k rule's threshold is floor"),
                         ({"rule": "tau", "k": 5}, "budget k would not be used: the tau rule uses tau and value"),
                         ({"rule": "tau", "floor": 0.3, "lift": 0.2}, "budget floor, lift would not be used: the tau rule"),
                         ({"rank": "prob", "lift": 0.3}, "budget lift would not be used: it applies to rank lift only")):
        with pytest.raises(ValueError, match=says):
            b.with_(**change)
    assert Budget(rule="tau", tau=0.7).with_(rule="top_k", k=4) == Budget(rule="top_k", k=4)
    for lift in (0, 1.5, True):
        with pytest.raises(ValueError, match="lift must lie in"):
            Budget(rule="top_k", k=2, rank="lift", lift=lift)
    with pytest.raises(ValueError, match="rank by lift needs"):
        active_mask(P, b)


@pytest.mark.parametrize("budget", [Budget(rule="tau", tau=0.5), Budget(rule="top_k", k=2, floor=None, value="prob"),
                                    Budget(rule="top_k", k=3, floor=0.5, value="centred", rank="centred"),
                                    Budget(rule="top_k", k=3, floor=0.5, value="centred", rank="lift", lift=0.75)])
def test_the_sparse_form_equals_the_dense_values(budget):
    from cqg_ray.mbqa.budget import sparse_budget

    mask, values = apply_budget(P, budget, MEAN)
    X = sparse_budget(P, budget, MEAN)
    assert X.dtype == np.float32 and X.shape == P.shape and X.nnz == mask.sum()
    assert np.array_equal(X.toarray(), values)


def test_ties_at_the_k_th_place_go_to_the_lower_question_index():
    P_tied = np.array([[0.7, 0.6, 0.6, 0.9, 0.6, 0.6],
                       [0.6, 0.6, 0.6, 0.6, 0.6, 0.6],
                       [0.1, 0.8, 0.8, 0.2, 0.3, 0.8]], dtype=np.float32)
    mask = active_mask(P_tied, Budget(rule="top_k", k=3, floor=None))
    assert mask.tolist() == [[True, True, False, True, False, False],
                             [True, True, True, False, False, False],
                             [False, True, True, False, False, True]]
