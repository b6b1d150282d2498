import math

import numpy as np

import pytest
import torch
from torch import nn

from cqg_ray.mbqa.heads import StackedHeads, masked_bce

D, M, H = 12, 7, 3


def separate_mlps(heads: StackedHeads) -> list[nn.Sequential]:
    """The reference design: m separate Linear(d, h) -> ReLU -> Linear(h, 1) modules with the same weights."""
    mlps = []
    for i in range(heads.m):
        mlp = nn.Sequential(nn.Linear(heads.d, heads.hidden), nn.ReLU(), nn.Linear(heads.hidden, 1))
        with torch.no_grad():
            mlp[0].weight.copy_(heads.w1[i])
            mlp[0].bias.copy_(heads.b1[i])
            mlp[2].weight.copy_(heads.w2[i].unsqueeze(0))
            mlp[2].bias.copy_(heads.b2[i : i + 1])
        mlps.append(mlp)
    return mlps


@pytest.fixture
def heads():
    torch.manual_seed(0)
    return StackedHeads(D, M, H)


def test_all_heads_on_every_text_equal_separate_mlps(heads):
    x = torch.randn(5, D)
    expected = torch.cat([mlp(x) for mlp in separate_mlps(heads)], dim=1)
    assert heads(x).shape == (5, M)
    torch.testing.assert_close(heads(x), expected, rtol=1e-5, atol=1e-6)


def test_grouped_heads_equal_separate_mlps(heads):
    x = torch.randn(M, 4, D)  # head i on its own 4 texts
    mlps = separate_mlps(heads)
    expected = torch.stack([mlps[i](x[i]).squeeze(1) for i in range(M)])
    torch.testing.assert_close(heads(x), expected, rtol=1e-5, atol=1e-6)


def test_pairs_equal_separate_mlps(heads):
    x = torch.randn(9, D)
    q = torch.tensor([0, 6, 3, 3, 1, 2, 5, 4, 0])
    mlps = separate_mlps(heads)
    expected = torch.stack([mlps[int(q[p])](x[p : p + 1]).reshape(()) for p in range(9)])
    torch.testing.assert_close(heads.forward_pairs(x, q), expected, rtol=1e-5, atol=1e-6)


def test_gradients_equal_separate_mlps(heads):
    x = torch.randn(M, 4, D)
    mlps = separate_mlps(heads)
    (heads(x) ** 2).sum().backward()
    sum((mlps[i](x[i]) ** 2).sum() for i in range(M)).backward()
    for i in range(M):
        torch.testing.assert_close(heads.w1.grad[i], mlps[i][0].weight.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(heads.b1.grad[i], mlps[i][0].bias.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(heads.w2.grad[i], mlps[i][2].weight.grad[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(heads.b2.grad[i], mlps[i][2].bias.grad[0], rtol=1e-5, atol=1e-6)


def test_init_bounds_are_nn_linear_defaults(heads):
    assert heads.w1.abs().max() <= 1 / math.sqrt(D)
    assert heads.w2.abs().max() <= 1 / math.sqrt(H)


def test_wrong_shapes_raise(heads):
    with pytest.raises(ValueError, match="d=12"):
        heads(torch.randn(2, D + 1))
    with pytest.raises(ValueError, match="m=7"):
        heads(torch.randn(M + 1, 2, D))
    with pytest.raises(ValueError, match="expects"):
        heads(torch.randn(D))


def test_masked_bce_against_hand_computation():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 3.0]])
    labels = torch.tensor([[1, 0], [0, -1]])
    mask = torch.tensor([[1, 1], [1, 0]])
    w = 3.0
    # -w log sigma(0) for the yes; -log(1 - sigma(z)) = log(1 + e^z) for the two no's; the unlabelled one is ignored
    hand = (w * math.log(2.0) + math.log(1 + math.e**2) + math.log(1 + math.e**-1)) / 3
    assert masked_bce(logits, labels, mask, w).item() == pytest.approx(hand, rel=1e-6)
    # same as torch's BCEWithLogitsLoss(pos_weight) averaged over the labelled entries
    ref = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(w))(logits[mask.bool()], labels[mask.bool()].float())
    assert masked_bce(logits, labels, mask, w).item() == pytest.approx(ref.item(), rel=1e-6)


def test_masked_bce_without_labels_is_zero_with_a_gradient():
    logits = torch.zeros(2, 3, requires_grad=True)
    loss = masked_bce(logits, torch.zeros(2, 3), torch.zeros(2, 3), 2.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros(2, 3))


def test_safetensors_round_trip(heads, tmp_path):
    path = tmp_path / "heads.safetensors"
    heads.save(str(path))
    loaded = StackedHeads.load(str(path))
    assert (loaded.d, loaded.m, loaded.hidden) == (D, M, H)
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    assert StackedHeads.from_bytes(heads.to_bytes()).config() == heads.config()


def test_corrupt_or_mismatched_files_raise(heads):
    with pytest.raises(ValueError, match="not a valid safetensors"):
        StackedHeads.from_bytes(b"garbage bytes")
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in heads.state_dict().items()}
    with pytest.raises(ValueError, match="metadata"):
        StackedHeads.from_bytes(save(tensors))
    bad = save(tensors, metadata={"config": '{"format": "cqg_ray.StackedHeads", "d": 12, "m": 8, "hidden": 3}'})
    with pytest.raises(ValueError, match="do not match"):
        StackedHeads.from_bytes(bad)


def test_probability_sums_come_in_chunks_bounded_by_the_heads_and_equal_one_pass():
    torch.manual_seed(0)
    heads = StackedHeads(6, 5, hidden=4)
    x = np.random.default_rng(0).standard_normal((37, 6)).astype(np.float32)
    whole = torch.sigmoid(heads.forward_all(torch.tensor(x))).double().sum(0).detach().numpy()
    seen = []
    forward_all = heads.forward_all
    heads.forward_all = lambda t: (seen.append(len(t)), forward_all(t))[1]
    sums = heads.probability_sums(x, floats=5 * 4 * 8)  # 8 texts x 5 heads x 4 hidden a chunk
    assert seen == [8, 8, 8, 8, 5]
    # a float32 matrix product's row may round differently at another batch size (oneDNN's AVX2 kernels on an Intel Xeon:
    # one unit in the last place): each text's probability is float32, its sum float64, so the bound is float32's rounding
    # of one probability a text; a text left out or counted twice moves a sum by ~0.5
    assert sums.dtype == np.float64 and np.allclose(sums, whole, rtol=0, atol=len(x) * 2 * np.finfo(np.float32).eps)
    assert heads.mean_probabilities(x) == pytest.approx((whole / 37).astype(np.float32), abs=1e-7)


def test_sorted_header_gives_equal_bytes_for_equal_contents():
    import numpy as np
    from safetensors.numpy import load, save

    from cqg_ray.mbqa.heads import safetensors_metadata, sorted_header

    tensors, meta = {"mean": np.arange(3, dtype=np.float32), "b": np.ones(2, np.float32)}, {"what": "w", "source": "s", "n": "3"}
    outs = {sorted_header(save(tensors, metadata=meta)) for _ in range(20)}
    assert len(outs) == 1
    (out,) = outs
    assert safetensors_metadata(out) == meta and {k: v.tolist() for k, v in load(out).items()} == {"mean": [0.0, 1.0, 2.0], "b": [1.0, 1.0]}

