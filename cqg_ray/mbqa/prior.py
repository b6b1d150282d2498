"""The question prior (``train.question_prior``): each head learns a correction to what its question's own text says.

    logit_i(x) = C_i(x) + alpha * cos(x, q_i) + beta

q_i is the frozen encoder's embedding of question i's text, so before any label a head already leans yes for texts
near its question ("Is the text about a printer?" for a sentence about a printer jam). alpha and beta are one logistic
fit of the training answers on the cosines (`fit_prior`, every question together), made before the heads train and
kept fixed while they do; the heads C_i then fit what the cosine misses, and with few labels a question (and weight
decay) they stay near it. Not in the paper, whose heads learn from ~1,000 labels a question: docs/mbqa.md#the-question-prior.

On unit-norm inputs the prior is linear in x, so `fold_prior` writes it into two more hidden units of each head
(ReLU(z) - ReLU(-z) = z): the saved heads are plain `StackedHeads` with hidden + 2 units, and nothing that loads,
calibrates, serves or budgets a model needs to know of it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from cqg_ray.mbqa.heads import StackedHeads


def unit_rows(x: np.ndarray) -> np.ndarray:
    """float32 rows scaled to unit length (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def fit_prior(cos: np.ndarray, answer: np.ndarray, all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
              ridge: float = 1e-3, iters: int = 50) -> tuple[float, float]:
    """(alpha, beta) of the logistic regression P(yes) = sigma(alpha * cos + beta) on the training pairs: Newton steps
    whose gradient and Hessian sums go through ``all_reduce`` (the workers' pairs together; none: these alone), so
    every worker gets the same fit. ``ridge``: a small L2 on both, per pair, so that one answer class still has a fit."""
    c = torch.as_tensor(np.asarray(cos, dtype=np.float64))
    y = torch.as_tensor(np.asarray(answer, dtype=np.float64))
    reduce = all_reduce or (lambda t: t)
    n = float(reduce(torch.tensor([float(len(c))], dtype=torch.float64))[0])
    if n == 0:
        raise ValueError("no labelled pairs to fit the question prior on")
    X = torch.stack([c, torch.ones_like(c)], 1)  # (P, 2)
    w = torch.zeros(2, dtype=torch.float64)
    for _ in range(iters):
        p = torch.sigmoid(X @ w)
        g = reduce(torch.cat([X.T @ (p - y), ((X.T * (p * (1 - p))) @ X).reshape(-1)])) / n
        grad, hess = g[:2] + ridge * w, g[2:].reshape(2, 2) + ridge * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hess, grad)
        w = w - step
        if float(step.abs().max()) < 1e-10:
            break
    return float(w[0]), float(w[1])


def pair_cosines(emb: np.ndarray, row: np.ndarray, question: np.ndarray, q_vectors: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """cos(text, question) of each pair: text emb[row[p]], question q_vectors[question[p]] (unit rows), in chunks."""
    out = np.empty(len(row), dtype=np.float32)
    for i in range(0, len(row), chunk):
        x = unit_rows(emb[row[i : i + chunk]])
        out[i : i + chunk] = np.einsum("pd,pd->p", x, q_vectors[question[i : i + chunk]])
    return out


class PriorHeads(nn.Module):
    """What trains: ``heads`` (the heads, or DDP's wrapper of them) on grouped texts x (m, K, d), plus the fixed prior."""

    def __init__(self, heads: nn.Module, q_vectors: np.ndarray, alpha: float, beta: float):
        super().__init__()
        self.heads, self.alpha, self.beta = heads, float(alpha), float(beta)
        self.register_buffer("q", torch.as_tensor(unit_rows(q_vectors)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xn = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return self.heads(x) + self.alpha * torch.einsum("mkd,md->mk", xn, self.q.to(x.dtype)) + self.beta


@torch.no_grad()
def fold_prior(heads: StackedHeads, q_vectors: np.ndarray, alpha: float, beta: float) -> StackedHeads:
    """``heads`` with the prior written into two more hidden units each (+-alpha * q_i, output weights +-1, beta in
    the output bias): the same logits as `PriorHeads` on unit-norm inputs, which is what a model's heads are given."""
    q = torch.as_tensor(unit_rows(q_vectors)).to(heads.w1.device, heads.w1.dtype)
    if q.shape != (heads.m, heads.d):
        raise ValueError(f"question vectors are {tuple(q.shape)}, the heads need ({heads.m}, {heads.d})")
    h = heads.hidden
    out = StackedHeads(heads.d, heads.m, h + 2).to(heads.w1.device, heads.w1.dtype)
    out.w1[:, :h], out.b1[:, :h], out.w2[:, :h] = heads.w1, heads.b1, heads.w2
    out.w1[:, h], out.w1[:, h + 1] = alpha * q, -alpha * q
    out.b1[:, h:] = 0.0
    out.w2[:, h], out.w2[:, h + 1] = 1.0, -1.0
    out.b2.copy_(heads.b2 + beta)
    return out
