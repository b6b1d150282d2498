"""Batched llama.cpp inference on one loaded model: single-pass yes/no scoring and batched greedy generation.

    engine = BatchEngine(llama, n_threads=2)                 # llama: a loaded llama_cpp.Llama (weights shared)
    engine.score([tokens, ...], yes_ids, no_ids)             # -> [(p_yes, cached_tokens), ...]
    for i, tokens in engine.generate([prompt_tokens, ...], max_tokens=260): ...

Scoring reads the answer from one position's logits, no decoding. A batch of prompts is evaluated as their prefix
tree in one ``llama_decode`` call: every token of the tree once, tagged with the sequence ids of all prompts it is
a prefix of (one KV cell serves them all, ``kv_unified``), and only each prompt's last position asks for logits.
So the chat template and instruction are computed once per batch, a text once for all its questions, and each
question's short suffix once: answering runs at llama.cpp's prompt speed on the tree's tokens.

Generation decodes several prompts together (continuous batching): a newly admitted prompt is read on its own,
then every step feeds one token per running sequence, so decoding is compute-bound over the batch instead of
memory-bound one sequence at a time; a finished sequence's slot takes the next prompt. Each sequence has its own KV stream (``kv_unified=False``), so attention
stays per sequence. Greedy (temperature 0, no repeat penalty), as the sequential path samples.

The grouping (``prefix_groups``, ``tree_entries``, ``tree_batches``) and the yes/no arithmetic (``p_yes_from_logits``)
are pure functions; the torch engine (``torch_engine.TorchEngine``) uses the same ones.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from cqg_ray import progress


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


GEN_CTX_STEP = 512  # a generation sequence's context is a multiple of this many tokens (llama.cpp pads to 256)
MIN_SHARED_PREFIX = 16  # a generation batch's common prefix shorter than this is read with each prompt


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens a generation batch reads once for all its prompts: their common prefix, less a token so that every prompt
    keeps one of its own to read; 0 for one prompt or a prefix shorter than MIN_SHARED_PREFIX."""
    if len(prompts) < 2:
        return 0
    shared = min(min(common_prefix(prompts[0], p) for p in prompts[1:]), min(len(p) for p in prompts) - 1)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def prefix_groups(token_lists: Sequence[Sequence[int]], max_seqs: int, max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive groups ``(start, end)`` of prompts evaluated in one batch as a prefix tree.

    Prompt j of a group adds ``len - lcp(previous, j)`` tokens (its first, ``lcp(...)`` = 0), which is the tree's cost when
    the prompts are in sorted order. A group holds at most ``max_seqs`` prompts and at most ``max_tokens`` tree tokens
    (a single prompt longer than that forms a group of its own).
    """
    if max_seqs < 1 or max_tokens < 1:
        raise ValueError("max_seqs and max_tokens must be >= 1")
    groups: list[tuple[int, int]] = []
    n, i = len(token_lists), 0
    while i < n:
        total, j = len(token_lists[i]), i + 1
        while j < n and j - i < max_seqs:
            add = len(token_lists[j]) - min(common_prefix(token_lists[j - 1], token_lists[j]), len(token_lists[j]) - 1)
            if total + add > max_tokens:
                break
            total += add
            j += 1
        groups.append((i, j))
        i = j
    return groups


def tree_entries(token_lists: Sequence[Sequence[int]]) -> tuple[list[tuple[int, int, list[int], bool]], list[int], list[int]]:
    """The prefix tree of prompts (sorted, so that prompts sharing a prefix are neighbours) as batch entries.

    Returns (entries, last, shared): ``entries`` are (token, position, prompts whose prefix it is, wants logits), each
    token of the tree once; ``last[j]`` is the entry after which prompt j's answer is read; ``shared[j]`` is how many of
    prompt j's tokens came from an earlier prompt. Every prompt keeps at least its last token as its own.
    """
    n = len(token_lists)
    lcp = [0] + [min(common_prefix(token_lists[j - 1], token_lists[j]), len(token_lists[j]) - 1, len(token_lists[j - 1]) - 1) for j in range(1, n)]
    entries: list[tuple[int, int, list[int], bool]] = []
    last: list[int] = []
    for j in range(n):
        t = token_lists[j]
        followers: list[int] = []  # prompts after j, with the running minimum of their lcp: node (j, pos) is theirs while that min > pos
        run = len(t)
        for i in range(j + 1, n):
            run = min(run, lcp[i])
            if run <= lcp[j]:
                break
            followers.append(run)
        for pos in range(lcp[j], len(t)):
            seqs = [j] + [j + 1 + k for k, m in enumerate(followers) if m > pos]
            entries.append((int(t[pos]), pos, seqs, pos == len(t) - 1))
        last.append(len(entries) - 1)
    return entries, last, lcp


def tree_batches(token_lists: Sequence[Sequence[int]], max_seqs: int, max_tokens: int):
    """The prompts sorted (prompts sharing a prefix become neighbours) and cut into prefix-tree batches (``prefix_groups``).

    Yields ``(indices, group, entries, last, shared)`` per batch: the group's positions in ``token_lists``, its prompts,
    and ``tree_entries`` of them. Every engine that scores by prefix tree goes through this."""
    for t in token_lists:
        if not t:
            raise ValueError("an empty prompt cannot be scored")
    order = sorted(range(len(token_lists)), key=lambda i: tuple(token_lists[i]))
    ordered = [token_lists[i] for i in order]
    for start, end in prefix_groups(ordered, max_seqs, max_tokens):
        group = ordered[start:end]
        entries, last, shared = tree_entries(group)
        yield order[start:end], group, entries, last, shared


def p_yes_from_logits(logits: np.ndarray, yes_ids: Sequence[int], no_ids: Sequence[int]) -> float:
    """P(yes) = softmax over the two answers, each the total probability of its spellings ("yes", "Yes", ...)."""
    x = np.asarray(logits, dtype=np.float64)
    ly = _logsumexp(x[list(yes_ids)])
    ln = _logsumexp(x[list(no_ids)])
    return float(1.0 / (1.0 + math.exp(min(ln - ly, 700.0))))


def _logsumexp(v: np.ndarray) -> float:
    m = float(v.max())
    return m + math.log(float(np.exp(v - m).sum()))


@dataclass
class _Slot:
    """One running sequence of a generation batch."""

    index: int  # into the prompts given to ``generate``
    prompt: list[int]
    max_tokens: int
    fed: int = 0  # prompt tokens already in the KV cache
    out: list[int] = field(default_factory=list)


class BatchEngine:
    """llama.cpp contexts over an already loaded ``llama_cpp.Llama`` model, for batched scoring and generation."""

    def __init__(self, llama, n_threads: int, score_seqs: int = 64, score_ctx: int = 8192, gen_seqs: int = 16, gen_ctx_per_seq: int = 4096,
                 n_ubatch: int = 512):
        import llama_cpp as lc

        self.lc = lc
        self.llama = llama
        self.model = llama._model.model
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.n_threads = n_threads
        self.score_seqs, self.score_ctx = score_seqs, score_ctx
        self.gen_seqs, self.gen_ctx_per_seq = gen_seqs, gen_ctx_per_seq
        self.n_ubatch = n_ubatch
        self.score_step = n_ubatch * 4  # tree tokens per decode call when scoring: a tree is read in a few, progress advancing between
        self._score_ctx = None
        self._gen_ctx = None

    # ------------------------------------------------------------------ contexts and batches

    def _context(self, n_ctx: int, n_seqs: int, unified: bool):
        lc = self.lc
        p = lc.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_ctx
        p.n_ubatch = min(self.n_ubatch, n_ctx)
        p.n_seq_max = n_seqs
        p.kv_unified = unified
        p.n_threads = self.n_threads
        p.n_threads_batch = self.n_threads
        p.no_perf = True
        p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as llama-cpp-python's Llama: the same numbers as its forward pass
        ctx = lc.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seqs})")
        return ctx

    def _decode(self, ctx, entries: list[tuple[int, int, Sequence[int], bool]]) -> None:
        """One ``llama_decode`` of (token, position, sequence ids, wants logits) entries."""
        lc = self.lc
        n_seq = max(len(e[2]) for e in entries)
        batch = lc.llama_batch_init(len(entries), 0, n_seq)
        try:
            for i, (tok, pos, seqs, logits) in enumerate(entries):
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = len(seqs)
                row = batch.seq_id[i]
                for k, s in enumerate(seqs):
                    row[k] = s
                batch.logits[i] = 1 if logits else 0
            batch.n_tokens = len(entries)
            rc = lc.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} ({len(entries)} tokens)")
        finally:
            lc.llama_batch_free(batch)

    def _logits(self, ctx, i: int) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(ctx, i)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))

    def _clear(self, ctx) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(ctx), True)

    # ------------------------------------------------------------------ scoring

    def score(self, token_lists: Sequence[Sequence[int]], yes_ids: Sequence[int], no_ids: Sequence[int], share_prefix: bool = True) -> list[tuple[float, int]]:
        """(P(yes) at the position after each prompt, prompt tokens shared with another prompt of its batch) per prompt."""
        if self._score_ctx is None:
            self._score_ctx = self._context(self.score_ctx, self.score_seqs, unified=True)
        ctx = self._score_ctx
        for t in token_lists:
            if len(t) > self.score_ctx:
                raise ValueError(f"a prompt of {len(t)} tokens does not fit the scoring context ({self.score_ctx})")
        out: list[tuple[float, int]] = [(float("nan"), 0)] * len(token_lists)
        batches = list(tree_batches(token_lists, self.score_seqs if share_prefix else 1, self.score_ctx))
        progress.add(handed=len(token_lists), planned=sum(len(b[2]) for b in batches))
        step = self.score_step
        for indices, _, entries, last, shared in batches:
            self._clear(ctx)
            prompt_at = {e: j for j, e in enumerate(last)}  # entry -> the prompt whose answer position it is
            for c0 in range(0, len(entries), step):
                chunk = entries[c0 : c0 + step]
                t0 = time.perf_counter()
                self._decode(ctx, chunk)
                progress.add(read=len(chunk), read_s=time.perf_counter() - t0)
                for e in range(c0, c0 + len(chunk)):
                    if e in prompt_at:
                        j = prompt_at[e]
                        out[indices[j]] = (p_yes_from_logits(self._logits(ctx, e - c0), yes_ids, no_ids), shared[j])
        return out

    # ------------------------------------------------------------------ generation

    def _generation_context(self, slots: int, per_seq: int):
        """The generation context: at least ``slots`` sequences and the shared prefix's own, each of at least ``per_seq``
        tokens (a multiple of GEN_CTX_STEP, at most ``gen_ctx_per_seq``), made to the first call's need and made again
        larger only for a call that needs more (llama.cpp clears the whole KV cache as it makes a context: docs/llm.md)."""
        lc = self.lc
        if self._gen_ctx is not None:
            have_seqs = lc.llama_n_seq_max(self._gen_ctx)
            have_per = lc.llama_n_ctx(self._gen_ctx) // have_seqs
            if have_seqs > slots and have_per >= per_seq:
                return self._gen_ctx
            slots, per_seq = max(slots, have_seqs - 1), max(per_seq, have_per)
            lc.llama_free(self._gen_ctx)
            self._gen_ctx = None
        per_seq = min(self.gen_ctx_per_seq, -(-per_seq // GEN_CTX_STEP) * GEN_CTX_STEP)
        self._gen_ctx = self._context(per_seq * (slots + 1), slots + 1, unified=False)
        return self._gen_ctx

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int], share_prefix: bool = True,
                 stop: Callable[[int, list[int]], bool] | None = None) -> Iterator[tuple[int, list[int]]]:
        """(index, generated tokens without the end token) per prompt, as each finishes (greedy): at an end token, at its
        ``max_tokens``, or where ``stop(index, tokens so far)`` says so. The prompts' common
        prefix (chat template, instructions, worked examples: ~600 of the property prompt's ~860 tokens), when at least
        ``MIN_SHARED_PREFIX`` tokens, is read once into a sequence of its own and copied into each slot as a prompt
        takes it (``llama_memory_seq_cp`` of a whole KV stream), so each prompt reads only its own rest."""
        lc = self.lc
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError("an empty prompt cannot be generated from")
            if len(p) + max_tokens[i] > self.gen_ctx_per_seq:
                raise ValueError(f"prompt {i}: {len(p)} tokens + {max_tokens[i]} new ones do not fit a sequence's context ({self.gen_ctx_per_seq})")
        if not prompts:
            return
        ctx = self._generation_context(min(self.gen_seqs, len(prompts)), max(len(p) + int(n) for p, n in zip(prompts, max_tokens)))
        n_slots = min(self.gen_seqs, lc.llama_n_seq_max(ctx) - 1)
        holder = lc.llama_n_seq_max(ctx) - 1  # the shared prefix's own sequence, after the slots
        self._clear(ctx)
        mem = lc.llama_get_memory(ctx)
        shared = shared_prefix(prompts) if share_prefix else 0
        progress.add(planned=shared)  # each prompt is handed as it takes a slot: one queued is no half-written reply (llm_eta)
        budget = self.n_ubatch  # prompt tokens per decode call (llama.cpp's micro-batch: a call per chunk costs nothing more)
        for c0 in range(0, shared, budget):
            t0 = time.perf_counter()
            self._decode(ctx, [(prompts[0][pos], pos, (holder,), False) for pos in range(c0, min(shared, c0 + budget))])
            progress.add(read=min(shared, c0 + budget) - c0, read_s=time.perf_counter() - t0)
        queue = list(range(len(prompts)))[::-1]
        slots: dict[int, _Slot] = {}
        while queue or slots:
            for s in range(n_slots):
                if s not in slots and queue:
                    i = queue.pop()
                    slots[s] = _Slot(i, list(prompts[i]), int(max_tokens[i]), fed=shared)
                    progress.add(handed=1, planned=len(prompts[i]) - shared)
                    if shared:  # the whole prefix stream copied (cross-stream copies take whole streams)
                        lc.llama_memory_seq_cp(mem, holder, s, -1, -1)
            entries: list[tuple[int, int, Sequence[int], bool]] = []
            reads: dict[int, int] = {}  # slot -> batch index of its logits
            # a prompt still being read goes alone (a chunk of it): with one KV stream per sequence llama.cpp splits a
            # batch into micro-batches with equally many tokens of every sequence, so mixing a long prompt with the
            # running sequences' single tokens would cost a model pass per prompt token
            reading = next((s for s, sl in slots.items() if sl.fed < len(sl.prompt)), None)
            if reading is not None:
                sl = slots[reading]
                n = min(len(sl.prompt) - sl.fed, budget)
                for pos in range(sl.fed, sl.fed + n):
                    entries.append((sl.prompt[pos], pos, (reading,), pos == len(sl.prompt) - 1))
                sl.fed += n
                if sl.fed == len(sl.prompt):
                    reads[reading] = len(entries) - 1
            else:
                for s, sl in slots.items():  # every running sequence: its last token
                    entries.append((sl.out[-1], len(sl.prompt) + len(sl.out) - 1, (s,), True))
                    reads[s] = len(entries) - 1
            t0 = time.perf_counter()
            self._decode(ctx, entries)
            if reading is not None:
                progress.add(read=len(entries), read_s=time.perf_counter() - t0)
            else:
                progress.add(generated=len(entries), generate_s=time.perf_counter() - t0)
            for s, idx in reads.items():
                sl = slots[s]
                tok = int(np.argmax(self._logits(ctx, idx)))
                done = bool(lc.llama_vocab_is_eog(self.vocab, tok))
                if not done:
                    sl.out.append(tok)
                if done or len(sl.out) >= sl.max_tokens or (stop is not None and stop(sl.index, sl.out)):
                    lc.llama_memory_seq_rm(mem, s, -1, -1)
                    del slots[s]
                    yield sl.index, sl.out

    def close(self) -> None:
        for name in ("_score_ctx", "_gen_ctx"):
            ctx = getattr(self, name, None)
            if ctx is not None:
                self.lc.llama_free(ctx)
                setattr(self, name, None)
