"""The load budget in torch, where the heads run: ``cqg_ray.mbqa.budget``'s rules (its numpy code is the reference)
applied to one chunk of probabilities at a time, so that only what the output needs leaves the device.

    mask = active_mask(p, budget, mean)             # (n, m) bool tensor on p's device; mean a tensor there too
    parts = [output_part(p, "sparse", budget, mean) for p in chunks]   # per chunk: what is copied to the host
    result = join_parts(parts, "sparse", m)         # the call's result: numpy arrays or a scipy csr_array

On CPU tensors the outputs equal the numpy reference's exactly, ties included: at the k-th place of a top-k budget
the lower question index wins, in both.
"""

from __future__ import annotations

import numpy as np
import torch

from cqg_ray.mbqa.budget import Budget

PACK_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # np.packbits' bit order: the first question is the highest bit


def top_k_mask(score: torch.Tensor, k: int) -> torch.Tensor:
    """(n, m) bool: each row's k highest scores (1 <= k < m), ties at the k-th place to the lower index."""
    kth = torch.topk(score, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)  # each row's k-th highest
    mask = score >= kth
    tied = torch.nonzero(row_counts(mask) > k).flatten()  # more than k: ties at the k-th place
    if len(tied):
        s, t = score[tied], kth[tied]
        above, at = s > t, s == t
        need = k - above.sum(dim=1, keepdim=True)
        mask[tied] = above | (at & (at.cumsum(dim=1) <= need))
    return mask


def row_counts(mask: torch.Tensor) -> torch.Tensor:
    """(n,) int32: the True entries of each row (summed as uint8: a bool sum goes through int64, ~10x slower on CPU)."""
    return mask.view(torch.uint8).sum(dim=1, dtype=torch.int32)


def active_mask(p: torch.Tensor, budget: Budget, mean: torch.Tensor | None = None) -> torch.Tensor:
    """(n, m) bool: the questions each row of probabilities ``p`` answers yes under ``budget`` (as the numpy
    ``active_mask``); ``mean`` (m,) on p's device: needed to rank by p - mean or by lift."""
    if budget.rule == "tau":
        return p > budget.tau
    m = p.shape[1]
    if budget.k >= m:
        mask = torch.ones_like(p, dtype=torch.bool)
    else:
        mask = top_k_mask(rank_score(p, budget, mean), budget.k)
    return mask.logical_and_(p > budget.floor) if budget.floor is not None else mask


def rank_score(p: torch.Tensor, budget: Budget, mean: torch.Tensor | None) -> torch.Tensor:
    """What the top_k rule ranks by (as the numpy ``rank_score``): p, p - mean, or p - lift * mean with the questions
    at or below the floor last (-inf)."""
    if budget.rank == "prob":
        return p
    if budget.rank == "centred":
        return p - _need(mean, "rank by p - mean")
    score = p - budget.lift * _need(mean, "rank by lift").to(p.dtype)
    return score if budget.floor is None else score.masked_fill(~(p > budget.floor), float("-inf"))


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """(n, ceil(m/8)) uint8: np.packbits(mask, axis=1) computed on mask's device."""
    n, m = mask.shape
    bits = torch.nn.functional.pad(mask.to(torch.uint8), (0, -m % 8)).view(n, -1, 8)
    weights = torch.tensor(PACK_WEIGHTS, dtype=torch.uint8, device=mask.device)
    return (bits * weights).sum(dim=2, dtype=torch.uint8)


def output_part(p: torch.Tensor, output: str, budget: Budget, mean: torch.Tensor | None = None):
    """What ``output`` needs of one chunk of probabilities (n, m), copied to the host: probs (n, m) float32; bits
    (n, m) uint8; packed (n, ceil(m/8)) uint8; sparse (per-row counts, column indices int32, values float32)."""
    if output == "probs":
        return p.float().cpu()
    mask = active_mask(p, budget, mean)
    if output == "bits":
        return mask.to(torch.uint8).cpu()
    if output == "packed":
        return pack_bits(mask).cpu()
    rows, cols = mask.nonzero(as_tuple=True)  # row-major, as np.nonzero
    data = p[rows, cols]
    if budget.value == "one":
        data = torch.ones_like(data)
    elif budget.value == "centred":
        data = data - _need(mean, "value 'centred'")[cols]
    return row_counts(mask).cpu(), cols.to(torch.int32).cpu(), data.float().cpu()


def join_parts(parts: list, output: str, m: int, order: np.ndarray | None = None):
    """The result of a call from its chunks' parts: a numpy array, or for sparse a ``scipy.sparse.csr_array`` (n, m).
    ``order``: the parts' rows are the texts ``order[0], order[1], ...`` (put back in place, one copy)."""
    if output != "sparse":
        width = (m + 7) // 8 if output == "packed" else m
        dtype = np.float32 if output == "probs" else np.uint8
        if order is None:
            return np.concatenate([t.numpy() for t in parts]) if parts else np.zeros((0, width), dtype=dtype)
        out, at = np.empty((len(order), width), dtype=dtype), 0
        for t in parts:
            out[order[at : at + len(t)]] = t.numpy()
            at += len(t)
        return out
    matrix = _csr(parts, m)
    if order is None or len(order) == 0:
        return matrix
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return matrix[inverse]


def zero_rows(result, rows: np.ndarray, output: str):
    """``result`` of ``join_parts`` with ``rows`` answering no to every question: zeros (probabilities 0, no active
    question); a sparse result keeps no stored entry in them."""
    if len(rows) == 0:
        return result
    if output != "sparse":
        result[rows] = 0
        return result
    import scipy.sparse as sp

    keep = np.ones(result.shape[0], dtype=result.dtype)
    keep[rows] = 0
    out = sp.csr_array(sp.diags_array(keep) @ result)
    out.eliminate_zeros()
    return out


def _csr(parts: list, m: int):
    import scipy.sparse as sp

    counts = np.concatenate([c.numpy() for c, _, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
    cols = np.concatenate([c.numpy() for _, c, _ in parts]) if parts else np.zeros(0, dtype=np.int32)
    data = np.concatenate([d.numpy() for _, _, d in parts]) if parts else np.zeros(0, dtype=np.float32)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_array((data, cols, indptr), shape=(len(counts), m))


def _need(mean: torch.Tensor | None, what: str) -> torch.Tensor:
    if mean is None:
        raise ValueError(f"budget {what} needs the questions' mean probabilities (the model's stats.safetensors)")
    return mean
