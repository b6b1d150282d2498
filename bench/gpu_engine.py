"""The torch single-pass engine on a GPU, on random weights of a model's shape (default Qwen2.5-7B's): labelling's
pairs per second and generation's tokens per second, each beside the same work without the engine's batching.

    python bench/gpu_engine.py                                   # Qwen2.5-7B's shape, cuda, bfloat16
    python bench/gpu_engine.py --shape tiny --device cpu         # the same code on a CPU in seconds (what the tests run)

Random weights: a lent GPU machine reaches no model hub and no file over 64 MiB travels there, and speed depends on
the shapes only. Token ids are drawn at random with the lengths of real prompts.
(a) single-pass scoring as labelling sends it: ``texts`` x ``questions`` pairs, each prompt a chat prefix shared by
    all, its text (shared by the text's questions), the question and the answer prefix; the engine's prefix trees of
    up to ``max_seqs`` prompts, against (b) one prompt per forward pass (``share_prefix=False``). pairs/s.
(c) generation as question writing sends it: ``gen_prompts`` prompts of ``gen_len`` tokens, ``max_new`` tokens each
    (random weights rarely emit an end token, so every sequence runs its ``max_new``), batches of ``gen_seqs``
    against one sequence at a time on the first ``gen_single`` prompts. tokens/s.
Printed: each measure, peak GPU memory, peak RSS. Last line: gpu_single_pass_tree_vs_unshared (pairs/s, (a) over (b)).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {  # transformers Qwen2Config fields
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                 max_position_embeddings=4096, tie_word_embeddings=False),
}


def random_model(shape: str, dtype: str, device: str, seed: int = 0):
    """A Qwen2 causal LM of ``shape`` with random weights, built on ``device`` in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], eos_token_id=SHAPES[shape]["vocab_size"] - 1)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))


def label_prompts(rng, vocab: int, texts: int, questions: int, prefix: int, text_len: int, question_len: int, tail: int) -> list[list[int]]:
    """texts x questions token lists: one chat prefix for all, a text each, a question each, one answer prefix."""
    draw = lambda n: rng.integers(10, vocab - 10, n).tolist()  # noqa: E731
    head, answer = draw(prefix), draw(tail)
    qs = [draw(question_len) for _ in range(questions)]
    return [head + t + q + answer for t in (draw(text_len) for _ in range(texts)) for q in qs]


def timed(fn, device) -> tuple[float, object]:
    """(seconds, result) of ``fn()``, the device synchronised on both sides."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--prefix", type=int, default=40, help="chat-template and instruction tokens before the text")
    ap.add_argument("--text-len", type=int, default=90, help="tokens per text (~300 characters)")
    ap.add_argument("--question-len", type=int, default=16)
    ap.add_argument("--max-seqs", type=int, nargs="+", default=[64, 256], help="prompts per prefix tree (one run each)")
    ap.add_argument("--unshared", type=int, default=256, help="pairs scored one prompt per forward pass")
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=1000)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--gen-seqs", type=int, default=64)
    ap.add_argument("--gen-single", type=int, default=2)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()

    import numpy as np
    import torch

    from cqg_ray.llm.engines.torch_engine import TorchEngine

    on_gpu = a.device.startswith("cuda")
    print(f"device: {torch.cuda.get_device_name() if on_gpu else a.device}; torch {torch.__version__}; shape {a.shape}; {a.dtype}", flush=True)
    t0 = time.perf_counter()
    model = random_model(a.shape, a.dtype, a.device)
    params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    engine = TorchEngine(None, dtype=a.dtype, device=a.device, model=model, max_seqs=max(a.max_seqs), max_tokens=8192,
                         gen_seqs=a.gen_seqs, eos_ids=[vocab - 1])
    print(f"random weights: {params / 1e9:.2f}B parameters, built in {time.perf_counter() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    pairs = label_prompts(rng, vocab, a.texts, a.questions, a.prefix, a.text_len, a.question_len, tail=4)
    yes, no = [vocab - 3], [vocab - 4]
    engine.score(pairs[: a.questions], yes, no)  # warm-up: kernels and allocator
    res: dict = {"shape": a.shape, "params": params, "device": torch.cuda.get_device_name() if on_gpu else a.device, "dtype": a.dtype,
                 "pairs": len(pairs), "prompt_tokens": len(pairs[0])}

    for m in a.max_seqs:
        engine.max_seqs = m
        sec, tree = timed(lambda: engine.score(pairs, yes, no), a.device)
        computed = len(pairs) * len(pairs[0]) - sum(s for _, s in tree)
        res[f"tree_{m}_pairs_per_s"] = len(pairs) / sec
        res[f"tree_{m}_tokens_computed_per_pair"] = computed / len(pairs)
        print(f"(a) prefix trees of {m}: {len(pairs)} pairs in {sec:.2f} s = {len(pairs) / sec:,.0f} pairs/s; "
              f"{computed / len(pairs):.1f} tokens computed a pair of {len(pairs[0])}", flush=True)
    n = min(a.unshared, len(pairs))
    sec, flat = timed(lambda: engine.score(pairs[:n], yes, no, share_prefix=False), a.device)
    res["unshared_pairs_per_s"] = n / sec
    print(f"(b) one prompt a pass: {n} pairs in {sec:.2f} s = {n / sec:,.0f} pairs/s", flush=True)
    gap = max(abs(x[0] - y[0]) for x, y in zip(tree[:n], flat))
    res["max_p_yes_gap_tree_vs_unshared"] = gap
    print(f"    largest P(yes) gap between (a) and (b) on the same pairs: {gap:.2e}", flush=True)

    gen = [rng.integers(10, vocab - 10, a.gen_len).tolist() for _ in range(a.gen_prompts)]
    for j in range(a.gen_prompts):  # question writing's prompts share the chat template and instruction
        gen[j][: a.prefix] = gen[0][: a.prefix]
    new = [a.max_new] * a.gen_prompts
    sec, outs = timed(lambda: list(engine.generate(gen, new)), a.device)
    tokens = sum(len(o) for _, o in outs)
    res["gen_batched_tokens_per_s"] = tokens / sec
    print(f"(c) generation, batches of {a.gen_seqs}: {tokens} tokens from {a.gen_prompts} prompts of {a.gen_len} in {sec:.2f} s = "
          f"{tokens / sec:,.0f} tokens/s", flush=True)
    engine.gen_seqs = 1
    sec1, outs1 = timed(lambda: list(engine.generate(gen[: a.gen_single], new[: a.gen_single])), a.device)
    tokens1 = sum(len(o) for _, o in outs1)
    res["gen_single_tokens_per_s"] = tokens1 / sec1
    res["gen_batched_vs_single"] = res["gen_batched_tokens_per_s"] / res["gen_single_tokens_per_s"]
    print(f"    one sequence at a time: {tokens1} tokens in {sec1:.2f} s = {tokens1 / sec1:,.0f} tokens/s; batched / single "
          f"{res['gen_batched_vs_single']:.1f}x", flush=True)
    res["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak GPU memory: {res['peak_gpu_gib'] or 0:.1f} GiB; peak RSS: {res['peak_rss_mib']:,.0f} MiB")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    best = max(res[f"tree_{m}_pairs_per_s"] for m in a.max_seqs)
    print(f"gpu_single_pass_tree_vs_unshared: {best / res['unshared_pairs_per_s']:.2f}")


if __name__ == "__main__":
    main()
