import numpy as np

from cqg_ray.cqg.select import dedup, priority_order, quality, top_t


def dedup_reference(emb: np.ndarray, order: np.ndarray, theta: float) -> np.ndarray:
    """The plain sequential O(m^2) definition of the theta dedup: keep a question unless it is too close to a kept one."""
    x = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    kept: list[int] = []
    for i in order:
        if all(float(x[i] @ x[j]) <= theta for j in kept):
            kept.append(int(i))
    return np.array(kept, dtype=np.int64)


def test_quality_equation_1_by_hand():
    # 5 positive probes, 3 hard + 2 easy negatives
    q = quality(pos_yes=np.array([5, 4, 0, 3]), pos_n=np.array([5, 5, 5, 5]), neg_yes=np.array([0, 1, 5, 5]), neg_n=np.array([5, 5, 5, 5]))
    assert np.allclose(q, [1.0, 0.8 - 0.2, -1.0, 0.6 - 1.0])


def test_quality_with_failed_probes():
    q = quality(np.array([2, 1]), np.array([4, 0]), np.array([1, 0]), np.array([5, 5]))
    assert np.isclose(q[0], 0.5 - 0.2)
    assert np.isnan(q[1])


def test_top_t():
    clusters = np.array([0, 0, 0, 1, 1, 2])
    q = np.array([0.1, 0.9, 0.5, np.nan, 0.2, -0.3])
    assert top_t(clusters, q, 2).tolist() == [1, 2, 4, 5]
    assert top_t(clusters, q, 1).tolist() == [1, 4, 5]
    # ties: the earlier question wins
    assert top_t(np.array([0, 0, 0]), np.array([0.5, 0.5, 0.5]), 2).tolist() == [0, 1]


def test_dedup_hand_case():
    emb = np.array([[1, 0, 0], [0.95, 0.312, 0], [0, 1, 0], [0, 0, 1], [0.7, 0.7, 0]], dtype=np.float32)
    q = np.array([0.9, 0.8, 0.7, 0.6, 1.0])
    order = priority_order(q, np.arange(5))
    assert order.tolist() == [4, 0, 1, 2, 3]
    kept, dup = dedup(emb, order, 0.8)
    # 4 kept first; 0: cos 0.707 with 4 -> kept; 1: cos 0.89 with 4 and 0.95 with 0 -> dropped (first kept
    # neighbour in priority order is 4); 2: cos 0.707 with 4, 0.31 with 1 -> kept; 3 is orthogonal -> kept
    assert kept.tolist() == [4, 0, 2, 3]
    assert dup.tolist() == [-1, 4, -1, -1, -1]


def test_dedup_matches_sequential_definition():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 16))
    emb = np.concatenate([base, base[:30] + rng.normal(scale=0.3, size=(30, 16))]).astype(np.float32)
    order = rng.permutation(len(emb))
    for theta in (0.5, 0.8, 0.95):
        kept, _ = dedup(emb, order, theta)
        assert kept.tolist() == dedup_reference(emb, order, theta).tolist()
