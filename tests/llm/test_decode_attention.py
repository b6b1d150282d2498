"""The torch engine's decoding step parts, on random tensors: ``decode_attention`` equals torch's SDPA (with the
key/value heads repeated) under a padding mask, and a ``preallocated_cache`` layer returns what a growing
``DynamicCache`` layer holds, through batch repeat and row selection."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cqg_ray.llm.engines.torch_engine import decode_attention, preallocated_cache  # noqa: E402


class Attn:  # what decode_attention reads of an attention module (nothing but what SDPA's path reads)
    is_causal, num_key_value_groups, training = True, 7, False


def test_decode_attention_equals_sdpa_with_repeated_heads():
    g = torch.Generator().manual_seed(0)
    b, kvh, groups, n, d = 3, 2, 7, 11, 64
    q = torch.randn(b, kvh * groups, 1, d, generator=g)
    k, v = torch.randn(b, kvh, n, d, generator=g), torch.randn(b, kvh, n, d, generator=g)
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)
    mask[0, ..., :4] = False  # row 0 left-padded by 4, row 2 by 1
    mask[2, ..., :1] = False
    out, weights = decode_attention(Attn(), q, k, v, mask, scaling=d**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask)
    assert weights is None and out.shape == (b, 1, kvh * groups, d)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)
    # the padding is really left out: changing a padded key changes nothing
    k2 = k.clone()
    k2[0, :, :4] = 100.0
    assert torch.equal(decode_attention(Attn(), q, k2, v, mask, scaling=d**-0.5)[0][0], out[0])


def test_decode_attention_passes_longer_queries_to_sdpa():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 14, 5, 64, generator=g), torch.randn(1, 2, 5, 64, generator=g), torch.randn(1, 2, 5, 64, generator=g)
    out, _ = decode_attention(Attn(), q, k, v, None, scaling=0.125)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(7, 1), v.repeat_interleave(7, 1), is_causal=True, scale=0.125)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)


def test_preallocated_cache_holds_what_a_growing_cache_holds():
    from transformers import DynamicCache, Qwen2Config

    config = Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    g = torch.Generator().manual_seed(2)
    ours, ref = preallocated_cache(config, capacity=12), DynamicCache(config=config)
    kv = lambda b, n: (torch.randn(b, 2, n, 16, generator=g), torch.randn(b, 2, n, 16, generator=g))  # noqa: E731
    steps = [("update", kv(1, 4)), ("repeat", 3), ("update", kv(3, 3)), ("update", kv(3, 1)), ("select", torch.tensor([0, 2])), ("update", kv(2, 1))]
    for op, arg in steps:
        if op == "update":
            returned = [layer.update(*arg) for layer in ours.layers]
            for layer in ref.layers:
                layer.update(*arg)
            if arg[0].shape[-2] == 1:  # a one-token step gets the whole buffer back, unwritten positions zero
                keys = returned[0][0]
                assert keys.shape[-2] == 12 and torch.count_nonzero(keys[..., ours.get_seq_length() :, :]) == 0
        for cache in (ours, ref):
            if op == "repeat":
                cache.batch_repeat_interleave(arg)
            elif op == "select":
                cache.batch_select_indices(arg)
        for a, r in zip(ours.layers, ref.layers):
            assert torch.equal(a.keys, r.keys) and torch.equal(a.values, r.values)
    assert ours.get_seq_length() == ref.get_seq_length() == 9
    assert ours.layers[0].get_mask_sizes(1) == (12, 0) and ours.layers[0].get_mask_sizes(2) == (11, 0)
    with pytest.raises(ValueError, match="holds 12 positions"):
        ours.layers[0].update(*kv(2, 4))


def test_greedy_takes_the_first_of_equal_maxima_as_argmax():
    from cqg_ray.llm.engines.torch_engine import greedy

    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 3.0, 3.0, 3.0], [-2.0, -1.0, -3.0, -1.0]], dtype=torch.bfloat16)
    assert greedy(logits).tolist() == logits.argmax(-1).tolist() == [1, 0, 1]


def tiny_qwen(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linears_give_the_dense_layers_logits(dtype):
    """Every linear layer packed where oneDNN multiplies the dtype natively (float32 on any x86 CPU; bfloat16 with
    AVX-512-BF16 or AMX, as ``pick_dtype`` reads the CPU); elsewhere nothing is packed and the model is unchanged."""
    from cqg_ray.hardware import pick_dtype
    from cqg_ray.llm.engines.torch_engine import pack_linears

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    model = tiny_qwen(dtype)
    ids = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        dense = model(input_ids=ids).logits
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert n_linear == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; the output matrix
    native = dtype == torch.float32 or pick_dtype() == "bfloat16"
    assert pack_linears(model, rows=4) == (n_linear if native else 0)
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == (0 if native else n_linear)
    with torch.inference_mode():
        ours = model(input_ids=ids).logits
    assert ours.dtype == dtype
    if dtype == torch.float32:  # the same products summed in oneDNN's order: torch's float32 tolerances
        torch.testing.assert_close(ours, dense)
    else:  # bfloat16 layers round each product to 8 bits of mantissa (2**-8 ~ 4e-3) along two layers
        torch.testing.assert_close(ours, dense, atol=2e-2, rtol=2e-2)
    assert torch.equal(ours.argmax(-1), dense.argmax(-1))


def test_without_onednn_nothing_is_packed(monkeypatch):
    from cqg_ray.llm.engines.torch_engine import pack_linears

    model = tiny_qwen(torch.bfloat16)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linears(model, rows=4) == 0
    assert sum(type(m) is torch.nn.Linear for m in model.modules()) == 15


def test_the_engine_decodes_a_tiny_model_without_deprecation_warnings():
    """Prompt reading and decoding hand the cache under the name this transformers takes (``cache`` where it has
    renamed ``past_key_values``, which warns on every call): a demo's log shows no FutureWarning."""
    import warnings

    from cqg_ray.llm.engines.torch_engine import TorchEngine

    engine = TorchEngine(None, dtype="float32", model=tiny_qwen(torch.float32), eos_ids=[299])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = dict(engine.generate([[1, 2, 3, 4, 5], [1, 2, 7]], [4, 3]))
    assert sorted(out) == [0, 1] and 1 <= len(out[0]) <= 4 and 1 <= len(out[1]) <= 3
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
