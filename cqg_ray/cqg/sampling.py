"""Contrastive sampling (paper section 3.1): positives, hard negatives and easy negatives per cluster. Pure numpy.

Documents are row indices into the (sorted) corpus; ``labels[i]`` is document i's cluster and
``neighbors[c]`` lists cluster c's nearest other clusters, nearest first.

For cluster c, with a generator seeded by (seed, c) so that a cluster's sample does not depend on
which other clusters are processed:
- positives: n_p documents of c (all of them when c is smaller);
- hard negatives: n_h documents drawn from the ``hard_neighbors`` nearest clusters together (paper: 3);
  when those clusters hold fewer than n_h documents, all of them are taken (no top-up from elsewhere);
- easy negatives: n_e documents from every other cluster (not c, not its hard-negative clusters);
  fewer when the rest of the corpus is smaller.
The three sets are disjoint by construction.

Probes (Equation 1) are drawn the same way per cluster, avoiding the documents shown in the generation
prompt when the cluster has enough others, so that a question is judged on texts it was not written from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cqg_ray.artifacts import ClusterIndex


def _choose(rng: np.random.Generator, pool: np.ndarray, n: int) -> np.ndarray:
    if n <= 0 or len(pool) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(pool) <= n:
        return rng.permutation(pool)
    return rng.choice(pool, size=n, replace=False)


def _choose_outside(rng: np.random.Generator, n_docs: int, labels: np.ndarray, excluded: set[int], n: int,
                    avoid: np.ndarray | None = None, n_allowed: int | None = None) -> np.ndarray:
    """n distinct documents whose cluster is not in ``excluded`` (rejection sampling: O(n) for big corpora)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    avoid_set = set() if avoid is None else set(avoid.tolist())
    if n_allowed is not None and n_allowed <= 4 * n:  # small remainder: enumerate it
        pool = np.flatnonzero(~np.isin(labels, list(excluded)))
        pool = pool[~np.isin(pool, list(avoid_set))] if avoid_set else pool
        return _choose(rng, pool, n)
    out: list[int] = []
    seen = set(avoid_set)
    tries = 0
    while len(out) < n and tries < 50 * n + 1000:
        i = int(rng.integers(0, n_docs))
        tries += 1
        if i in seen or int(labels[i]) in excluded:
            continue
        seen.add(i)
        out.append(i)
    return np.array(out, dtype=np.int64)


@dataclass
class Sample:
    cluster: int
    positives: np.ndarray
    hard: np.ndarray
    easy: np.ndarray


def contrastive_sample(index: ClusterIndex, neighbors: np.ndarray, c: int, n_pos: int, n_hard: int, n_easy: int,
                       hard_neighbors: int, seed: int, avoid: np.ndarray | None = None, salt: int = 0) -> Sample:
    """One cluster's positives, hard negatives and easy negatives (document indices), disjoint."""
    rng = np.random.default_rng([seed, salt, c])
    labels = index.labels
    avoid_arr = np.zeros(0, dtype=np.int64) if avoid is None else np.asarray(avoid)

    def prefer_fresh(pool: np.ndarray, n: int) -> np.ndarray:
        fresh = pool[~np.isin(pool, avoid_arr)] if len(avoid_arr) else pool
        return _choose(rng, fresh if len(fresh) >= n else pool, n)

    pos = prefer_fresh(index.members(c), n_pos)
    hard_clusters = [int(h) for h in neighbors[c][:hard_neighbors] if int(h) != c]
    hard_pool = np.concatenate([index.members(h) for h in hard_clusters]) if hard_clusters else np.zeros(0, np.int64)
    hard = prefer_fresh(hard_pool, n_hard)
    excluded = {c, *hard_clusters}
    n_allowed = len(labels) - index.size(c) - len(hard_pool)
    easy = _choose_outside(rng, len(labels), labels, excluded, min(n_easy, n_allowed), avoid_arr if len(avoid_arr) else None, n_allowed)
    if len(easy) < min(n_easy, n_allowed):  # every allowed document is in `avoid`: fall back to allowing them
        easy = _choose_outside(rng, len(labels), labels, excluded, min(n_easy, n_allowed), None, n_allowed)
    return Sample(c, pos.astype(np.int64), hard.astype(np.int64), easy.astype(np.int64))


def generation_samples(index: ClusterIndex, neighbors: np.ndarray, clusters: list[int], n_p: int, n_h: int, n_e: int,
                       hard_neighbors: int, seed: int, prompts: int = 1) -> list[Sample]:
    """The CQG prompts' positives / hard / easy negatives (n_p, n_h, n_e): ``prompts`` samples per cluster, cluster by
    cluster; a cluster's second and later samples prefer positives its earlier ones did not show."""
    out = []
    for c in clusters:
        shown = np.zeros(0, dtype=np.int64)
        for r in range(prompts):
            s = contrastive_sample(index, neighbors, c, n_p, n_h, n_e, hard_neighbors, seed, avoid=shown if r else None,
                                   salt=0 if r == 0 else 10 + r)
            shown = np.concatenate([shown, s.positives])
            out.append(s)
    return out


def probe_samples(index: ClusterIndex, neighbors: np.ndarray, gen: list[Sample], p_p: int, p_h: int, p_e: int,
                  hard_neighbors: int, seed: int) -> list[Sample]:
    """Probe documents per cluster (p_p, p_h, p_e), one sample per cluster, avoiding the documents of the cluster's
    generation samples when possible."""
    shown: dict[int, list[np.ndarray]] = {}
    for s in gen:
        shown.setdefault(s.cluster, []).extend([s.positives, s.hard, s.easy])
    return [contrastive_sample(index, neighbors, c, p_p, p_h, p_e, hard_neighbors, seed, avoid=np.concatenate(arrs), salt=1)
            for c, arrs in shown.items()]


def qaemb_articles(index: ClusterIndex, c: int, n: int, seed: int) -> np.ndarray:
    """QAEmb reference articles for prompt c: n random documents, drawn per cluster so every region of the corpus gets a prompt."""
    rng = np.random.default_rng([seed, 2, c])
    return _choose(rng, index.members(c), n).astype(np.int64)
