"""Clustering: the faiss core on hand-made data (no Ray) and the stage on real embeddings."""

import numpy as np
import pytest

from cqg_ray.cluster import assign, centroid_neighbors, drop_empty, train_kmeans


def blobs(seed=0):
    rng = np.random.default_rng(seed)
    centers = np.eye(8, dtype=np.float32)[:4] * 5
    x = np.concatenate([c + rng.normal(0, 0.1, (50, 8)) for c in centers]).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True), np.repeat(np.arange(4), 50)


def test_kmeans_recovers_blobs():
    x, truth = blobs()
    cent, obj = train_kmeans(x, 4, niter=20, seed=1)
    labels, score = assign(x, cent)
    # each true blob maps to exactly one cluster
    for b in range(4):
        assert len(set(labels[truth == b])) == 1
    assert len(set(labels)) == 4
    assert np.all(score > 0.9)
    assert obj > 0


def test_kmeans_needs_enough_points():
    with pytest.raises(ValueError, match="at least 5 points"):
        train_kmeans(np.zeros((3, 2), np.float32), 5)


def test_assign_hand_case():
    cent = np.array([[1, 0], [0, 1]], np.float32)
    x = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], np.float32)
    labels, score = assign(x, cent)
    assert labels.tolist() == [0, 1, 0]
    assert np.allclose(score, [0.9, 0.8, 0.6])


def test_centroid_neighbors_hand_case():
    c = np.array([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], np.float32)
    nb, sims = centroid_neighbors(c, 2)
    assert nb.tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    assert np.allclose(sims[0], [0.8, 0.0])
    nb_all, _ = centroid_neighbors(c, 10)  # capped at k-1, never itself
    assert nb_all.shape == (4, 3)
    assert all(i not in row for i, row in enumerate(nb_all.tolist()))


def test_drop_empty_renumbers():
    cent = np.arange(8, dtype=np.float32).reshape(4, 2)
    labels, c2, removed = drop_empty(np.array([0, 3, 3, 0]), cent)
    assert removed == 2
    assert labels.tolist() == [0, 1, 1, 0]
    assert c2.tolist() == [[0, 1], [6, 7]]
    same, c3, none = drop_empty(np.array([0, 1]), cent[:2])
    assert none == 0 and same.tolist() == [0, 1]
