"""The torch engine's int8 decoding (``add_int8_decoding``, ``TorchEngine(dtype="int8")``) on a small random Qwen2:
every linear layer gets an int8 twin per output channel while the float layer and the embeddings stay as they were, a
twin computes the integer product of its 7-bit quantized input, and the engine uses the twins in decoding steps only
(prompts and scoring read as in float32, exactly)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cqg_ray.llm.engines.torch_engine import TorchEngine, add_int8_decoding  # noqa: E402


def tiny_qwen(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


def test_every_linear_gets_an_int8_twin_per_output_channel_and_the_float_weights_stay():
    model = tiny_qwen()
    linears = {n: m.weight.detach().clone() for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    assert len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, and the output
    switch = add_int8_decoding(model)
    assert switch == [False]
    assert model.lm_head.float_linear.weight is model.get_input_embeddings().weight  # still tied: nothing copied
    for name, w in linears.items():
        dual = model.get_submodule(name)
        assert torch.equal(dual.float_linear.weight, w)
        q = dual.int8_linear.weight()
        assert q.dtype == torch.qint8 and q.q_per_channel_axis() == 0 and not q.q_per_channel_zero_points().any()  # symmetric: zero points 0
        scales = q.q_per_channel_scales().float()
        # symmetric per row: the largest magnitude sets the step (127.5 steps), and every weight is within half a step of its own
        # (plus float32's rounding of w / step, at most 128 steps: a few ulps of 128)
        assert torch.allclose(scales, w.abs().amax(dim=1) / 127.5)
        assert bool(((q.dequantize() - w).abs() <= scales[:, None] * (0.5 + 4 * 128 * torch.finfo(torch.float32).eps)).all())


def test_an_int8_twin_is_the_integer_product_of_its_7_bit_quantized_input():
    """y = s_x s_w (x_q - z) W_q^T + b, with x quantized by its own range (0 included) into 0..127 (reduce_range: AVX2's
    16-bit pair sums cannot saturate) and the products summed in int32: equal up to float32 rounding of the rescale."""
    lin = torch.nn.Linear(64, 8)
    torch.nn.init.normal_(lin.weight)
    model = torch.nn.Sequential(lin)
    switch = add_int8_decoding(model)
    q = model[0].int8_linear
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 3
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    s_x = (hi - lo) / 127
    z = min(max(round(-lo / s_x), 0), 127)
    xq = torch.clamp(torch.round(x / s_x) + z, 0, 127).to(torch.int64)
    wq = q.weight().int_repr().to(torch.int64)
    s_w = q.weight().q_per_channel_scales().double()
    ref = ((xq - z) @ wq.T).double() * s_x * s_w + q.bias().detach().double()
    with torch.no_grad():
        switch[0] = True
        got = model(x).double()
        switch[0] = False
        assert torch.equal(model(x), lin(x))  # the switch off: the float layer
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_the_int8_engine_reads_prompts_and_scores_in_float32_and_decodes_in_int8():
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 7], [9, 8]]
    float_engine = TorchEngine(None, dtype="float32", n_threads=1, model=tiny_qwen(1), eos_ids=[0])
    engine = TorchEngine(None, dtype="int8", n_threads=1, model=tiny_qwen(1), eos_ids=[0])
    assert engine.dtype_name == "int8" and engine.dtype == torch.float32 and engine.packed == float_engine.packed
    assert engine.score(prompts, [10], [11]) == float_engine.score(prompts, [10], [11])  # the same float products
    seen = []
    engine.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, args, out: seen.append((args[0].shape[1], engine.int8_steps[0])))
    out = dict(engine.generate(prompts, [4, 4, 4]))
    ref = dict(float_engine.generate(prompts, [4, 4, 4]))
    assert [out[i][:1] for i in range(3)] == [ref[i][:1] for i in range(3)]  # the first token comes from the float prompt read
    reads, steps = [on for rows, on in seen if rows > 1], [on for rows, on in seen if rows == 1]
    assert reads and steps and not any(reads) and all(steps)  # int8 in the one-token steps only
    assert engine.int8_steps == [False]


def test_int8_is_a_cpu_path():
    with pytest.raises(ValueError, match="CPU path"):
        TorchEngine(None, dtype="int8", device="cuda", model=tiny_qwen())
