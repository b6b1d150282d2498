"""Texts and prompts of our labelling plan (``cqg_ray.mbqa.label_plan.make_label_plan``) on a balanced clustering.

``label_packing_estimate`` is the closed form the planner uses (instant at any scale); ``simulate_label_packing``
runs the real ``make_label_plan`` on a synthetic clustering (``cqg-ray plan --simulate``, and the tests that check the
estimate against it).
"""

from __future__ import annotations

import math

import numpy as np

from cqg_ray.config import LabelConfig


def _binom_pmf(n: int, p: float) -> np.ndarray:
    return np.array([math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)])


def _poisson_pmf(lam: float, tail: float = 1e-12) -> np.ndarray:
    out, i, p = [], 0, math.exp(-lam)
    while True:
        out.append(p)
        i += 1
        p = p * lam / i
        if i > lam and p < tail:
            return np.array(out)


def _expected_prompts(pmf: np.ndarray, per_prompt: int) -> tuple[float, float]:
    """(E[ceil(Q / per_prompt)], P(Q > 0)) for Q with the given pmf."""
    q = np.arange(len(pmf))
    return float(np.sum(pmf * np.ceil(q / per_prompt))), float(1 - pmf[0])


def label_packing_estimate(n_docs: int, k: int, m: int, per_cluster: int, label: LabelConfig) -> dict:
    """Expected texts and prompts of our labelling plan (``cqg_ray.mbqa.label_plan.make_label_plan``) on a balanced clustering.

    Derivation. Clusters hold S = N/k texts. A question of cluster c takes the first a = min(n_cluster, S) texts of
    c's shared permutation, b = min(quota, J S) / J texts from the front of each of its J = neighbor_clusters
    neighbours (quota = n_neighbor plus the own-cluster shortfall) and r random texts (the rest of
    min(n_cluster + n_neighbor + n_random, N)). Questions per cluster are Binomial(per_cluster, s) with
    s = m / (k per_cluster) (each selected question survives dedup independently); with nearest-cluster lists
    treated as random, a cluster is the neighbour of D ~ Poisson(J) clusters, so the neighbour questions that read
    its front are Binomial(D per_cluster, s). A text at position p of its cluster's permutation is asked
    Q = own [p < a] + neighbour [p < b] questions and needs ceil(Q / 20) prompts; summing the expectations over
    positions and clusters gives the own/neighbour prompts and distinct texts. Random texts walk a pool of
    ceil(m r / 20) texts cyclically, so each pool text gets about 20 random questions: about m r / 20 more prompts
    (a pool text that is also a front text needs ceil((Q + 20) / 20) = ceil(Q / 20) + 1 prompts: the counts add).
    Real nearest-neighbour graphs have hubs (clusters that are everyone's neighbour): those texts exceed 20
    questions more often, so the real count can be somewhat higher.
    """
    if m == 0 or n_docs == 0:
        return {"texts": 0, "prompts": 0, "front_texts": 0, "random_pool": 0}
    qpp, J = label.questions_per_prompt, label.neighbor_clusters
    S = n_docs / k
    total = min(label.n_cluster + label.n_neighbor + label.n_random, n_docs)
    a = min(label.n_cluster, S)
    quota = label.n_neighbor + (label.n_cluster - a)
    nbr_take = min(quota, J * S, total - a)
    b = nbr_take / J
    r = total - a - nbr_take
    s = min(1.0, m / (k * per_cluster))
    own = _binom_pmf(per_cluster, s)
    nbr = np.zeros(1)
    for d, pd in enumerate(_poisson_pmf(J)):
        pmf = _binom_pmf(d * per_cluster, s)
        if len(pmf) > len(nbr):
            nbr = np.pad(nbr, (0, len(pmf) - len(nbr)))
        nbr[: len(pmf)] += pd * pmf
    both = np.convolve(own, nbr)
    p_both, t_both = _expected_prompts(both, qpp)
    p_own, t_own = _expected_prompts(own, qpp)
    p_nbr, t_nbr = _expected_prompts(nbr, qpp)
    lo, hi = min(a, b), max(a, b)
    front_prompts = k * (lo * p_both + (hi - lo) * (p_own if a > b else p_nbr))
    front_texts = k * (lo * t_both + (hi - lo) * (t_own if a > b else t_nbr))
    random_pairs = m * r
    pool = min(n_docs, max(r, math.ceil(random_pairs / qpp))) if r > 0 else 0
    if label.random_from == "labelled" and r > 0 and front_texts >= pool:
        # random pairs spread over the labelled texts: each gets R ~ Poisson(m r / front_texts) more questions
        R = _poisson_pmf(random_pairs / front_texts)

        def with_random(pmf: np.ndarray) -> float:
            labelled = pmf.copy()
            labelled[0] = 0.0  # only texts that are labelled anyway take random questions
            conv = np.convolve(labelled, R)
            return float(np.sum(conv * np.ceil(np.arange(len(conv)) / qpp)))

        own_nb = with_random(own) if a > b else with_random(nbr)
        prompts = k * (lo * with_random(both) + (hi - lo) * own_nb)
        return {"texts": int(round(front_texts)), "prompts": int(round(prompts)), "front_texts": int(round(front_texts)),
                "random_pool": int(round(front_texts)), "min_texts": int(round(k * (1 - own[0]) * a))}
    random_prompts = math.ceil(random_pairs / qpp) if r > 0 else 0
    texts = front_texts + pool * (1 - front_texts / n_docs)
    return {"texts": int(round(texts)), "prompts": int(round(front_prompts + random_prompts)),
            "front_texts": int(round(front_texts)), "random_pool": int(pool), "min_texts": int(round(k * (1 - own[0]) * a))}


SIMULATE_MAX_K = 16_384  # the neighbour draw's k x (k - 1) random float64s: 2 GiB here
SIMULATE_MAX_DOCS = 100_000_000  # every text's cluster, drawn as a permutation: ~1.6 GB of int64s here


def simulate_label_packing(n_docs: int, k: int, m: int, per_cluster: int, label: LabelConfig, seed: int = 0) -> dict:
    """Run the real ``make_label_plan`` on a synthetic balanced clustering (random neighbour lists, Binomial questions per
    cluster rescaled to exactly m): exact counts of our packing for that layout. Memory ~ 30 bytes per pair, and
    8 k (k - 1) bytes for the neighbour lists' draw and 16 bytes a text (k above ``SIMULATE_MAX_K`` or texts above
    ``SIMULATE_MAX_DOCS`` is a ValueError)."""
    from cqg_ray.mbqa.label_plan import make_label_plan

    if k > SIMULATE_MAX_K:  # was a MemoryError traceback (7.3 TiB at k = 1M), or the machine swapping
        raise ValueError(f"--simulate draws a k x (k - 1) matrix for the neighbour lists, {8 * k * (k - 1) / 2**30:,.0f} GiB at "
                         f"k = {k:,}: simulate at k <= {SIMULATE_MAX_K:,}, or leave --simulate out (the estimate needs no draw)")
    if n_docs > SIMULATE_MAX_DOCS:  # was a MemoryError traceback (7.3 TiB at 1e12 texts)
        raise ValueError(f"--simulate draws every text's cluster, {16 * n_docs / 2**30:,.0f} GiB at {n_docs:,} texts: simulate at "
                         f"--docs <= {SIMULATE_MAX_DOCS:,}, or leave --simulate out (the estimate needs no draw)")
    rng = np.random.default_rng(seed)
    assignments = rng.permutation(np.arange(n_docs) % k)
    J = max(1, min(label.neighbor_clusters, k - 1))
    neighbors = (np.arange(k)[:, None] + 1 + np.argsort(rng.random((k, k - 1)), axis=1)[:, :J]) % k  # J distinct others
    per = rng.binomial(per_cluster, min(1.0, m / (k * per_cluster)), size=k)
    while per.sum() != m:  # exactly m questions: add to / remove from random clusters within [0, per_cluster]
        c = rng.integers(k)
        if per.sum() < m and per[c] < per_cluster:
            per[c] += 1
        elif per.sum() > m and per[c] > 0:
            per[c] -= 1
    question_clusters = np.repeat(np.arange(k), per)
    lp = make_label_plan(assignments, neighbors, question_clusters, label)
    c = lp.counts()
    return {"texts": c["docs"], "prompts": c["prompts"], "pairs": c["pairs"]}
