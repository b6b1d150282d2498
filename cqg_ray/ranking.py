"""Exact top-k with ties: the one ranking helper that search, clustering and evaluation share."""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, k: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k best scores of each row and their ids, best first; exact with ties: among equal scores the lower id wins.

    scores: (n, c), or one row (c,); ids: the same shape (default: the column positions 0..c-1). Returns (scores,
    ids), each (n, min(k, c)), or (min(k, c),) for one row. Every candidate tied with the k-th score is considered.
    """
    one = np.ndim(scores) == 1
    scores = np.atleast_2d(scores)
    ids = np.broadcast_to(np.arange(scores.shape[1]), scores.shape) if ids is None else np.atleast_2d(ids)
    k = max(0, min(k, scores.shape[1]))
    if k == 0:
        out_s, out_i = scores[:, :0], ids[:, :0]
    else:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        out_s, out_i = np.take_along_axis(scores, part, axis=1), np.take_along_axis(ids, part, axis=1)
        order = np.lexsort((out_i, -out_s), axis=-1)
        out_s, out_i = np.take_along_axis(out_s, order, axis=1), np.take_along_axis(out_i, order, axis=1)
        # rows where more candidates tie with the k-th score than fit: the lowest ids among the tied ones
        for r in np.flatnonzero((scores >= out_s[:, -1:]).sum(axis=1) > k):
            cand = np.flatnonzero(scores[r] >= out_s[r, -1])
            best = cand[np.lexsort((ids[r, cand], -scores[r, cand]))[:k]]
            out_s[r], out_i[r] = scores[r, best], ids[r, best]
    return (out_s[0], out_i[0]) if one else (out_s, out_i)
