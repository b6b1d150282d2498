"""The training core without Ray: shards of the labelled texts, the question-major step layout, the epoch loop.

Steps are question-major: each step gives every head C_i the next K = `pairs_per_head` of its own labelled texts
(shuffled each epoch), computed as one batched matmul (m, K, d) x (m, d, hidden) -- see `StackedHeads.forward_grouped`.
The cost of a step is proportional to the labelled pairs, not to texts x m as in the paper's per-text steps (where
all m heads run on every text although ~4 of them have an answer). The loss is the paper's weighted BCE over the
labelled pairs only, pos_weight = #no / #yes (`masked_bce`); Adam with lr alpha = 1e-4.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Callable

import numpy as np
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.heads import StackedHeads, masked_bce
from cqg_ray.mbqa.pairs import LabelPairs


def make_shards(pairs: LabelPairs, num_workers: int, seed: int = 0) -> list[dict]:
    """Split the labelled texts over workers (a seeded permutation of the texts dealt round-robin).

    Each shard: `docs` (global text rows, in local-row order), and its pairs as `row` (local row), `question`, `answer`
    (the training target: hard 0/1, or P(yes) with soft labels).
    """
    docs = np.unique(pairs.doc)
    owner = np.empty(len(docs), dtype=np.int64)
    owner[np.random.default_rng([seed, 0x5348]).permutation(len(docs))] = np.arange(len(docs)) % num_workers
    pair_owner = owner[np.searchsorted(docs, pairs.doc)]
    shards = []
    for w in range(num_workers):
        mine = docs[owner == w]
        keep = pair_owner == w
        shards.append({"docs": mine, "row": np.searchsorted(mine, pairs.doc[keep]).astype(np.int64),
                       "question": pairs.question[keep], "answer": pairs.training_target[keep]})
    return shards


def steps_per_epoch(shards: list[dict], n_questions: int, pairs_per_head: int) -> int:
    """Steps that cover every pair of every shard once (the same for all workers, so DDP stays in step)."""
    most = max((int(np.bincount(s["question"], minlength=n_questions).max()) if len(s["question"]) else 0) for s in shards)
    return max(1, math.ceil(most / pairs_per_head))


def epoch_layout(question: np.ndarray, pairs_per_head: int, seed: int, epoch: int, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Question-major step layout of one epoch: each question's pairs shuffled, the i-th K-block going to step i.

    Returns (order, step, slot): pair order[j] goes to step step[j] in slot slot[j] of its question; `order` is sorted
    by step so step s is a contiguous block.
    """
    n = len(question)
    rng = np.random.default_rng([seed, epoch, rank])
    by_q = np.lexsort((rng.random(n), question))
    q_sorted = question[by_q]
    start = np.searchsorted(q_sorted, q_sorted, side="left")
    pos = np.arange(n) - start
    step = pos // pairs_per_head
    by_step = np.argsort(step, kind="stable")
    return by_q[by_step], step[by_step], (pos % pairs_per_head)[by_step]


def run_epochs(
    heads: StackedHeads,
    opt: torch.optim.Optimizer,
    shard: dict,
    n_steps: int,
    cfg: TrainConfig,
    pos_weight: float,
    start_epoch: int,
    on_epoch_end: Callable[[int, dict], None],
    model: torch.nn.Module | None = None,
    device: torch.device | str = "cpu",
    rank: int = 0,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """The training loop (no Ray): epochs start_epoch..cfg.epochs-1 of question-major steps over one shard.

    `model` is what is called (the DDP wrapper when data-parallel; default: `heads`); `all_reduce` sums the
    epoch's loss statistics over workers. `on_epoch_end(epoch, metrics)` is called after every epoch.
    """
    model = model if model is not None else heads
    m, K = heads.m, cfg.pairs_per_head
    with warnings.catch_warnings():  # shards from the object store are read-only; they are never written
        warnings.simplefilter("ignore", UserWarning)
        emb = torch.as_tensor(shard["emb"]).to(device)
    if len(emb) == 0:  # a worker without texts still runs every step (all masked) to keep DDP in step
        emb = torch.zeros(1, emb.shape[1], device=device)
    buf = torch.empty(m * K, emb.shape[1], dtype=emb.dtype, device=device)  # reused: fresh 100 MB buffers fault pages
    row, question = shard["row"], shard["question"]
    answer = shard["answer"].astype(np.float32)
    for epoch in range(start_epoch, cfg.epochs):
        t0 = time.perf_counter()
        order, step, slot = epoch_layout(question, K, cfg.seed, epoch, rank)
        bounds = np.searchsorted(step, np.arange(n_steps + 1))
        stats = torch.zeros(2, dtype=torch.float64)  # sum of loss x pairs, pairs
        for s in range(n_steps):
            sel = order[bounds[s] : bounds[s + 1]]
            q, k = question[sel], slot[bounds[s] : bounds[s + 1]]
            idx = np.zeros((m, K), dtype=np.int64)
            y = np.zeros((m, K), dtype=np.float32)
            mask = np.zeros((m, K), dtype=bool)
            idx[q, k], y[q, k], mask[q, k] = row[sel], answer[sel], True
            torch.index_select(emb, 0, torch.from_numpy(idx).view(-1).to(device), out=buf)
            x = buf.view(m, K, -1).float()  # (m, K, d): head i's texts in x[i]
            logits = model(x)
            loss = masked_bce(logits, torch.from_numpy(y).to(device), torch.from_numpy(mask).to(device), pos_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats += torch.tensor([loss.item() * len(sel), len(sel)], dtype=torch.float64)
        if all_reduce is not None:
            stats = all_reduce(stats)
        seconds = time.perf_counter() - t0
        metrics = {"epoch": epoch + 1, "loss": float(stats[0] / max(stats[1], 1)), "pairs": int(stats[1]),
                   "steps": n_steps, "seconds": round(seconds, 3), "pairs_per_s": round(float(stats[1]) / max(seconds, 1e-9), 1),
                   "start_epoch": start_epoch}
        on_epoch_end(epoch, metrics)


def make_optimizer(heads: StackedHeads, cfg: TrainConfig) -> torch.optim.Adam:
    """Adam at ``train.lr``; ``train.weight_decay`` is each head's own L2 (its objective: the mean loss over its texts
    + wd / 2 * |its weights|^2). A step's loss is the mean over every head's pairs, so each head's share of the gradient
    is ~1/m of its own mean's: Adam's coupled decay is wd / m to keep that ratio."""
    fused = heads.w1.device.type in ("cpu", "cuda") and heads.w1.dtype == torch.float32
    return torch.optim.Adam(heads.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay / heads.m, fused=fused)

