"""cqg_ray.ranking: exact top-k, ties to the lower id."""

import numpy as np

from cqg_ray.ranking import top_k


def test_top_k_ties_by_row_order():
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9, 0.5])
    assert top_k(scores, 3)[1].tolist() == [1, 4, 0]
    assert top_k(scores, 4)[1].tolist() == [1, 4, 0, 2]
    assert top_k(scores, 10)[1].tolist() == [1, 4, 0, 2, 5, 3]
    assert top_k(scores, 10)[0].tolist() == [0.9, 0.9, 0.5, 0.5, 0.5, 0.1]
    assert top_k(scores, 0)[1].tolist() == []


def test_top_k_per_row_with_ids_equals_a_full_sort():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(50, 40)).astype(np.float32)  # many ties at every cut
    ids = np.broadcast_to(np.arange(100, 140), scores.shape)[:, ::-1]  # higher columns have lower ids
    for k in (1, 5, 39, 40, 60):
        s, i = top_k(scores, k, ids)
        assert s.shape == i.shape == (50, min(k, 40))
        for r in range(50):
            want = sorted(zip(-scores[r], ids[r]))[:k]
            assert list(zip(-s[r], i[r])) == want
    assert top_k(scores, 0, ids)[1].shape == (50, 0)
