"""bench/hand_reliability.py: the AUC of a score for the hand answers, ties a half."""

import numpy as np
from tests.scripts import load_script

hr = load_script("bench/hand_reliability.py", "bench_hand_reliability")


def test_auc_counts_pairs_ranked_right_and_ties_as_a_half():
    truth = np.array([True, True, False, False, False])
    assert hr.auc(np.array([0.9, 0.8, 0.1, 0.2, 0.3]), truth) == 1.0
    assert hr.auc(np.array([0.1, 0.2, 0.9, 0.8, 0.7]), truth) == 0.0
    # true 0.5 and 0.3 against false 0.5, 0.2, 0.1: (0.5 + 1 + 1) + (0 + 1 + 1) = 4.5 of 6
    assert hr.auc(np.array([0.5, 0.3, 0.5, 0.2, 0.1]), truth) == 0.75
    assert hr.auc(np.array([0.5, 0.3]), np.array([True, True])) is None
