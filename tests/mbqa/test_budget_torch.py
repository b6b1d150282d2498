"""The budget in torch (where the heads run) against the numpy reference: identical outputs on CPU tensors."""

import numpy as np
import pytest
import torch

from cqg_ray.mbqa import budget_torch
from cqg_ray.mbqa.budget import Budget, active_mask, apply_budget, sparse_budget

BUDGETS = [Budget(rule="tau", tau=0.5), Budget(rule="tau", tau=0.73, value="prob"),
           Budget(rule="top_k", k=3, floor=None), Budget(rule="top_k", k=7, floor=0.5, value="prob"),
           Budget(rule="top_k", k=5, floor=0.5, value="centred", rank="centred"),
           Budget(rule="top_k", k=11, floor=0.2, value="one", rank="centred"),
           Budget(rule="top_k", k=50, floor=0.5, value="centred", rank="centred"),  # k >= m
           Budget(rule="top_k", k=4, floor=0.3, value="prob", rank="lift", lift=0.3),
           Budget(rule="top_k", k=6, floor=None, rank="lift", lift=1.0),
           Budget(rule="top_k", k=5, floor=0.5, value="centred", rank="lift", lift=0.75)]


def probabilities(n=37, m=11, seed=0):
    """Probabilities with many exact ties (a grid of 8 values) and a mean on the same grid, so p - mean ties too."""
    rng = np.random.default_rng(seed)
    p = (rng.integers(0, 8, (n, m)) / 8 + 1 / 16).astype(np.float32)
    mean = (rng.integers(0, 4, m) / 8).astype(np.float32)
    return p, mean


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: b.name)
def test_every_output_equals_the_numpy_reference(budget):
    p, mean = probabilities()
    pt, mt = torch.from_numpy(p), torch.from_numpy(mean)
    mask = active_mask(p, budget, mean)
    assert np.array_equal(budget_torch.active_mask(pt, budget, mt).numpy(), mask)
    chunks = [pt[:5], pt[5:6], pt[6:30], pt[30:]]
    join = lambda out: budget_torch.join_parts([budget_torch.output_part(c, out, budget, mt) for c in chunks], out, p.shape[1])  # noqa: E731
    assert np.array_equal(join("probs"), p)
    bits = join("bits")
    assert bits.dtype == np.uint8 and np.array_equal(bits, mask.view(np.uint8))
    packed = join("packed")
    assert packed.dtype == np.uint8 and np.array_equal(packed, np.packbits(mask, axis=1))
    got, want = join("sparse"), sparse_budget(p, budget, mean)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data)
    assert np.array_equal(got.toarray(), apply_budget(p, budget, mean)[1])


def test_ties_in_torch_go_to_the_lower_question_index_as_in_numpy():
    p = torch.tensor([[0.7, 0.6, 0.6, 0.9, 0.6, 0.6], [0.6] * 6])
    mask = budget_torch.active_mask(p, Budget(rule="top_k", k=3, floor=None))
    assert mask.tolist() == [[True, True, False, True, False, False], [True, True, True, False, False, False]]


def test_no_chunks_give_empty_outputs_of_the_right_shape():
    for out, shape, dtype in [("probs", (0, 11), np.float32), ("bits", (0, 11), np.uint8), ("packed", (0, 2), np.uint8)]:
        got = budget_torch.join_parts([], out, 11)
        assert got.shape == shape and got.dtype == dtype
    sparse = budget_torch.join_parts([], "sparse", 11)
    assert sparse.shape == (0, 11) and sparse.nnz == 0


def test_ranking_by_p_minus_mean_needs_the_mean():
    with pytest.raises(ValueError, match="rank by p - mean needs"):
        budget_torch.active_mask(torch.rand(2, 5), Budget(rule="top_k", k=2, rank="centred"))


@pytest.mark.parametrize("output", ["probs", "bits", "packed", "sparse"])
def test_parts_in_another_order_are_put_back_in_place(output):
    p, mean = probabilities(n=23)
    budget = Budget(rule="top_k", k=4, floor=0.3, value="centred", rank="centred")
    order = np.random.default_rng(1).permutation(len(p))
    pt, mt = torch.from_numpy(p[order]), torch.from_numpy(mean)
    parts = [budget_torch.output_part(pt[i : i + 5], output, budget, mt) for i in range(0, len(p), 5)]
    got = budget_torch.join_parts(parts, output, p.shape[1], order)
    want = budget_torch.join_parts([budget_torch.output_part(torch.from_numpy(p), output, budget, mt)], output, p.shape[1])
    if output == "sparse":
        assert got.dtype == np.float32 and np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        got, want = got.toarray(), want.toarray()
    assert got.dtype == want.dtype and np.array_equal(got, want)
