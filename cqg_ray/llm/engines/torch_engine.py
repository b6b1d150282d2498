"""Single-pass yes/no scoring and batched greedy generation in torch (transformers), on the bundled model's weights
dequantised once.

    engine = TorchEngine("~/.cache/cqg-ray/models/qwen2.5-coder-0.5b-hf", dtype="bfloat16", n_threads=2)   # device="cuda" on a GPU
    engine.score([tokens, ...], yes_ids, no_ids)            # -> [(p_yes, shared_tokens), ...], like BatchEngine.score
    for i, tokens in engine.generate([prompt_tokens, ...], [260, ...]): ...  # like BatchEngine.generate

The same prefix tree as the llama.cpp engine (``batch.tree_entries``), run as one sequence: each tree token once,
its position its depth, and a 4D attention mask that lets a token see only its own ancestors; P(yes) comes from
the final hidden state at each prompt's last token times the yes/no rows of the output matrix (softmax over
the two answers needs no other logits).

Generation runs static batches of ``gen_seqs`` prompts of similar length (sorted): the batch's common prefix (chat
template, instruction) is read once, then each prompt's own tokens are read on their own (no padding to compute) and
their keys and values written into the prompt's row of the batch's cache, right-aligned; then each step feeds every
running sequence its last token (one matrix product over the batch, not one per sequence); a sequence that emits an
end token or reaches its ``max_tokens`` leaves the batch at once (its cache rows dropped) and is yielded. Greedy, no
repeat penalty, as the llama.cpp paths; a retry at a temperature is drawn by llama.cpp's default sampler chain
(``sampler``). A decoding step attends with ``decode_attention`` (each key/value head against
its group of query heads, no copies; torch's CPU flash-attention kernel spent more than half of a step on one query
row) into a cache allocated once per batch (``preallocated_cache``: written in place, not concatenated every step).
The model's linear layers run on weights reordered once for oneDNN (``pack_linears``). bfloat16 reaches the matrix
units of CPUs with AVX-512-BF16 or AMX; on others it is emulated and float32 is the fast choice (``hardware.pick_dtype``).
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from cqg_ray import progress
from cqg_ray.hardware import pick_dtype
from cqg_ray.llm.engines.batch import p_yes_from_logits, shared_prefix, tree_batches


def decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for one query position (a decoding step): query (b, h, 1, d) against key/value (b, kvh, L, d) as
    (b, kvh, h / kvh, d) groups, softmax in float32; longer queries (prompts, prefix trees) go to torch's SDPA."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    b, h, _, d = query.shape
    kvh = key.shape[1]
    scores = torch.matmul(query.reshape(b, kvh, h // kvh, d), key.transpose(-1, -2)).float() * (d**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # SDPA's mask: bool (True = attend) or additive, (b or 1, 1, 1, L)
        scores = scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool else scores + attention_mask
    out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)  # (b, kvh, h / kvh, d)
    return out.reshape(b, 1, h, d), None


def register_decode_attention() -> str:
    """Register ``decode_attention`` (with SDPA's masks) with transformers under the name it returns."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register("cqg_decode", decode_attention)
    AttentionMaskInterface.register("cqg_decode", sdpa_mask)
    return "cqg_decode"


def preallocated_cache(config, capacity: int):
    """A transformers ``DynamicCache`` whose layers hold ``capacity`` positions from the start and write each token's
    keys and values in place. A one-token step attends over the whole buffer, unwritten positions masked out (so the
    2D attention mask passed with it must span ``capacity`` columns, 0 beyond the written ones): the buffer stays one
    contiguous block that the attention's matrix products read without a copy (a grown or sliced cache is copied
    every step)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def allocate(self, rows: int, like, length: int = 0) -> None:
            """Zeros for ``rows`` sequences shaped like ``like`` (b, kv heads, L, d); the first ``length`` positions count as written."""
            self.lazy_initialization(like, like)
            shape = (rows, like.shape[1], capacity, like.shape[-1])
            self._k, self._v, self.length = like.new_zeros(shape), like.new_zeros(shape), length
            self.keys, self.values = self._k[..., :length, :], self._v[..., :length, :]

        def put(self, rows, start: int, key_states, value_states) -> None:
            """Write keys and values (kv heads, L, d) at positions ``start`` .. ``start + L`` of ``rows`` (an index or a slice)."""
            end = start + key_states.shape[-2]
            self._k[rows, :, start:end], self._v[rows, :, start:end] = key_states, value_states

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.allocate(key_states.shape[0], key_states)
            n, q = self.length, key_states.shape[-2]
            if n + q > capacity:
                raise ValueError(f"the cache holds {capacity} positions; {n} + {q} asked")
            self._k[..., n : n + q, :], self._v[..., n : n + q, :] = key_states, value_states
            self.length = n + q
            self.keys, self.values = self._k[..., : n + q, :], self._v[..., : n + q, :]
            return (self._k, self._v) if q == 1 else (self.keys, self.values)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return (capacity, 0) if query_length == 1 and self.is_initialized else super().get_mask_sizes(query_length)

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._select(lambda t: t.repeat_interleave(repeats, dim=0))

        def batch_select_indices(self, indices) -> None:
            self._select(lambda t: t[indices])

        def _select(self, f) -> None:
            if self.is_initialized:
                self._k, self._v = f(self._k), f(self._v)
                self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]

    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer() for _ in cache.layers]
    return cache


def greedy(logits):
    """Each row's greedy token: the first index of its largest logit, as ``argmax`` (``max`` finds it ~4x faster over a
    bfloat16 vocabulary: 2.3 against 9.0 ms for 32 rows of 151,936)."""
    return logits.max(-1).indices


def sampler(temperature: float, seed: int, device, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05):
    """Each row's next token drawn from its logits as llama.cpp's default chain draws it (``create_chat_completion``:
    top-k 40, top-p 0.95, min-p 0.05, then the temperature), from a generator seeded with ``seed``; greedy at
    temperature 0."""
    import torch

    if temperature <= 0:
        return greedy
    gen = torch.Generator(device=device).manual_seed(int(seed))

    def pick(logits):
        top, idx = logits.float().topk(min(top_k, logits.shape[-1]), dim=-1)  # sorted, largest first
        probs = torch.softmax(top, dim=-1)
        cut = probs.cumsum(-1) - probs >= top_p  # beyond the smallest head reaching top_p
        cut |= probs < min_p * probs[..., :1]
        cut[..., 0] = False
        probs = torch.softmax((top / temperature).masked_fill(cut, float("-inf")), dim=-1)
        return idx.gather(-1, torch.multinomial(probs, 1, generator=gen)).squeeze(-1)

    return pick


def pack_linears(model, rows: int) -> int:
    """Replace the model's ``nn.Linear`` layers (decoder and output) by ``PackedLinear`` (oneDNN's blocked weight layout for
    about ``rows`` input rows; same products, 10-50% faster at 32 rows in bfloat16 on a 2-core AVX-512-BF16 CPU).
    Returns how many were packed: 0 where this torch has no oneDNN linear, or for a bfloat16 model where the CPU
    (as ``hardware.cpu_flags`` reads it) has no native bfloat16 (the model is left as it was)."""
    import torch

    class PackedLinear(torch.nn.Module):
        """``F.linear`` on a weight reordered once for oneDNN (``torch.ops.mkldnn``, what inductor's freezing uses)."""

        def __init__(self, linear):
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
            self.bias = None if linear.bias is None else linear.bias.detach()

        def forward(self, x):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    if not torch.backends.mkldnn.is_available():
        return 0
    if model.dtype == torch.bfloat16 and pick_dtype() != "bfloat16":  # oneDNN refuses it (AVX2) or emulates it (capped)
        return 0
    try:
        probe = torch.nn.Linear(8, 4, dtype=model.dtype)
        torch.testing.assert_close(PackedLinear(probe)(torch.ones(2, 8, dtype=model.dtype)), probe(torch.ones(2, 8, dtype=model.dtype)))
    except (RuntimeError, AssertionError):
        return 0
    names = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, PackedLinear(getattr(owner, child)))
    return len(names)


def tree_mask(token_lists: Sequence[Sequence[int]], lcp: Sequence[int], n_entries: int) -> np.ndarray:
    """(n, n) bool: entry a may attend to entry b, i.e. b is on the path from the root to a (a included).

    Entries are numbered as ``tree_entries`` numbers them: prompt by prompt, each prompt's own tokens from ``lcp[j]``."""
    mask = np.zeros((n_entries, n_entries), dtype=bool)
    chain: list[int] = []  # entry index of each position of the previous prompt's path
    e = 0
    for j, t in enumerate(token_lists):
        chain = chain[: lcp[j]] + list(range(e, e + len(t) - lcp[j]))
        for pos in range(lcp[j], len(t)):
            mask[e, chain[: pos + 1]] = True
            e += 1
    return mask


class TorchEngine:
    """A causal LM in torch that scores single-pass prompts as prefix trees and decodes greedy batches."""

    def __init__(self, model_dir: str | Path | None, dtype: str = "auto", n_threads: int | None = None, max_seqs: int = 64, max_tokens: int = 2048,
                 gen_seqs: int = 16, eos_ids: Sequence[int] = (), device: str = "cpu", model=None):
        """``model_dir``: a transformers folder; or ``model``: a causal LM already built (``model_dir`` None), e.g.
        random weights for a benchmark, moved to ``device`` in ``dtype``. ``device``: "cpu", or "cuda" (no oneDNN
        packing there)."""
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        if n_threads:
            torch.set_num_threads(n_threads)
        self.device = torch.device(device)
        self.dtype_name = (pick_dtype() if self.device.type == "cpu" else "bfloat16") if dtype == "auto" else dtype
        self.dtype = getattr(torch, self.dtype_name)
        if model is None:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # its "Loading weights" bar: the stage's own progress is what a user reads
            model = AutoModelForCausalLM.from_pretrained(str(Path(model_dir).expanduser()), dtype=self.dtype,
                                                         attn_implementation=register_decode_attention())
        else:
            model.set_attn_implementation(register_decode_attention())
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.out = self.model.get_output_embeddings().weight  # dense: scoring reads its yes and no rows
        self.packed = pack_linears(self.model, gen_seqs) if self.device.type == "cpu" else 0
        self.lm_head = self.model.get_output_embeddings()
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.gen_seqs = gen_seqs
        self.read_chunk = 512  # prompt tokens per forward pass when generating (a long prompt is read in several)
        # the decoder's cache argument: `cache` where transformers has renamed `past_key_values` (deprecated there, with a warning a call)
        self.cache_arg = "cache" if "cache" in inspect.signature(self.model.model.forward).parameters else "past_key_values"
        self.eos_ids = list(eos_ids) or [int(t) for t in np.atleast_1d(self.model.generation_config.eos_token_id or self.model.config.eos_token_id)]

    def tensor(self, data, dtype=None):
        """``data`` as a tensor on the engine's device."""
        return self.torch.as_tensor(data, dtype=dtype, device=self.device)

    def score(self, token_lists: Sequence[Sequence[int]], yes_ids: Sequence[int], no_ids: Sequence[int], share_prefix: bool = True) -> list[tuple[float, int]]:
        """(P(yes) at the position after each prompt, prompt tokens shared with another prompt of its batch) per prompt."""
        torch = self.torch
        rows = self.tensor(list(yes_ids) + list(no_ids))
        ny = len(yes_ids)
        yes_cols, no_cols = range(ny), range(ny, ny + len(no_ids))
        out: list[tuple[float, int]] = [(float("nan"), 0)] * len(token_lists)
        batches = list(tree_batches(token_lists, self.max_seqs if share_prefix else 1, self.max_tokens))
        progress.add(handed=len(token_lists), planned=sum(len(b[2]) for b in batches))
        for indices, group, entries, last, shared in batches:
            t0 = time.perf_counter()
            mask = self.tensor(tree_mask(group, shared, len(entries)))[None, None]
            ids = self.tensor([[e[0] for e in entries]])
            pos = self.tensor([[e[1] for e in entries]])
            with torch.inference_mode():
                hidden = self.model.model(input_ids=ids, position_ids=pos, attention_mask=mask).last_hidden_state[0]
                logits = (hidden[last] @ self.out[rows].T).double().cpu().numpy()  # the yes and no rows of the output matrix only
            progress.add(read=len(entries), read_s=time.perf_counter() - t0)
            for j, i in enumerate(indices):
                out[i] = (p_yes_from_logits(logits[j], yes_cols, no_cols), shared[j])
        return out

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], temperature: float = 0.0,
                 seed: int = 0, stop: Callable[[int, list[int]], bool] | None = None) -> Iterator[tuple[int, list[int]]]:
        """(index, generated tokens without the end token) per prompt, as each finishes; greedy, or at ``temperature``
        > 0 drawn by ``sampler`` seeded with ``seed``; ``gen_seqs`` at a time, shortest prompts first; a sequence ends at
        any of ``eos_ids`` (the model's end-of-generation tokens when the embedded backend made this engine, else its
        generation config's), at its ``max_tokens``, or where ``stop(index, tokens so far)`` says so."""
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError("an empty prompt cannot be generated from")
            if max_tokens[i] < 1:
                raise ValueError(f"prompt {i}: max_tokens must be >= 1, got {max_tokens[i]}")
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        pick = sampler(temperature, seed, self.device)
        for s in range(0, len(order), self.gen_seqs):
            batch = order[s : s + self.gen_seqs]
            own = None if stop is None else (lambda j, out, batch=batch: stop(batch[j], out))
            for j, out in self._generate_batch([prompts[i] for i in batch], [int(max_tokens[i]) for i in batch], pick, own):
                yield batch[j], out

    def _generate_batch(self, prompts: list[Sequence[int]], max_tokens: list[int], pick=greedy,
                        stop: Callable[[int, list[int]], bool] | None = None) -> Iterator[tuple[int, list[int]]]:
        """One static batch: the prompts' common prefix (chat template and instruction) read once, then each prompt's rest
        read on its own (no padding to compute) and its keys and values written into its row of the batch's cache,
        right-aligned; then one token per running sequence per step."""
        from transformers import DynamicCache

        torch = self.torch
        n = len(prompts)
        shared = shared_prefix(prompts)
        progress.add(handed=n, planned=shared + sum(len(p) - shared for p in prompts))
        filled = max(len(p) for p in prompts)  # the cache's columns: shared prefix, left padding, own tokens, then generated
        capacity = filled + max(max_tokens)
        cache = preallocated_cache(self.model.config, capacity)
        prefix = DynamicCache(config=self.model.config)
        mask = torch.zeros((n, capacity), dtype=torch.long, device=self.device)
        mask[:, :shared] = 1
        last_hidden = []
        with torch.inference_mode():
            if shared:
                self.read_chunks(prompts[0], 0, shared, prefix)
            for j, p in enumerate(prompts):
                row = DynamicCache(config=self.model.config)
                if shared:  # the row's cache starts as the prefix's (``update`` concatenates: the prefix's tensors stay as they are)
                    for own, pre in zip(row.layers, prefix.layers):
                        own.lazy_initialization(pre.keys, pre.values)
                        own.keys, own.values = pre.keys, pre.values
                last_hidden.append(self.read_chunks(p, shared, len(p), row))
                start = filled - (len(p) - shared)
                for layer, own in zip(cache.layers, row.layers):
                    if j == 0:
                        layer.allocate(n, own.keys, filled)
                        layer.put(slice(None), 0, own.keys[0, :, :shared], own.values[0, :, :shared])
                    layer.put(j, start, own.keys[0, :, shared:], own.values[0, :, shared:])
                mask[j, start:filled] = 1
            nxt = pick(self.lm_head(torch.stack(last_hidden)))
        last_pos = self.tensor([len(p) - 1 for p in prompts])
        eos = self.tensor(self.eos_ids, dtype=torch.long)
        rows = list(range(n))  # batch row -> index into prompts, for the sequences still running
        outs: list[list[int]] = [[] for _ in range(n)]
        with torch.inference_mode():
            while rows:
                done, tokens = torch.isin(nxt, eos).tolist(), nxt.tolist()  # one copy from the device a step
                keep = []
                for r, j in enumerate(rows):
                    if not done[r]:
                        outs[j].append(tokens[r])
                    if done[r] or len(outs[j]) >= max_tokens[j] or (stop is not None and stop(j, outs[j])):
                        yield j, outs[j]
                    else:
                        keep.append(r)
                if not keep:
                    break
                if len(keep) < len(rows):  # finished sequences leave the batch: their cache rows and mask rows go
                    sel = self.tensor(keep)
                    cache.batch_select_indices(sel)
                    mask, nxt, last_pos = mask[sel], nxt[sel], last_pos[sel]
                    rows = [rows[r] for r in keep]
                mask[:, filled] = 1
                filled += 1
                last_pos = last_pos + 1
                t0 = time.perf_counter()
                hidden = self.model.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos[:, None], use_cache=True,
                                          **{self.cache_arg: cache}).last_hidden_state
                nxt = pick(self.lm_head(hidden[:, -1]))
                progress.add(generated=len(rows), generate_s=time.perf_counter() - t0)

    def read_chunks(self, tokens: Sequence[int], start: int, stop: int, cache) -> Any:
        """Read ``tokens[start:stop]`` into ``cache`` in chunks of at most ``read_chunk`` tokens (progress advances
        between them; the cache makes the chunks one causal read); the last position's hidden state."""
        torch = self.torch
        for c0 in range(start, stop, self.read_chunk):
            c1 = min(stop, c0 + self.read_chunk)
            t0 = time.perf_counter()
            hidden = self.model.model(input_ids=self.tensor([list(tokens[c0:c1])]), position_ids=torch.arange(c0, c1, device=self.device)[None],
                                      use_cache=True, **{self.cache_arg: cache}).last_hidden_state
            progress.add(read=c1 - c0, read_s=time.perf_counter() - t0)
        return hidden[0, -1]

    def close(self) -> None:
        self.model = None

