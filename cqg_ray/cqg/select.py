"""Scoring and selection (paper section 3.1, post-processing). Pure numpy (+ faiss for the dedup).

- ``quality``: Equation 1, yes-rate on positive probes minus yes-rate on negative (hard + easy) probes.
- ``top_t``: per source cluster, the t questions of highest quality (ties: earlier generated first).
- ``text_filters`` / ``own_cluster_no``: the selection filters (``cqg.filters``): a question copied from a text
  (a run of 6 words), one too long, one cut off, one its own cluster does not answer yes (for more than a share of its
  positive probes, and optionally above an Eq. 1 floor); they drop, never rewrite.
- ``select``: top-t, then dedup, then the ``opening`` filter: while one opening (first four words) holds more than
  ``max_opening_share`` of the kept questions, its lowest-quality kept questions beyond that share are dropped and
  the selection is redone, so their clusters' next-best questions can take their places.
- ``dedup``: walk the top-t questions from best to worst quality and drop one whose embedding has cosine
  > theta with a question already kept. Done with one faiss range search over all candidates and a
  greedy pass over their neighbour lists, which gives exactly the sequential result at O(m * neighbours)
  after the search, not a Python O(m^2) loop.
"""

from __future__ import annotations

import numpy as np


def quality(pos_yes: np.ndarray, pos_n: np.ndarray, neg_yes: np.ndarray, neg_n: np.ndarray) -> np.ndarray:
    """Equation 1: #yes(pos)/p_p - #yes(neg)/(p_h + p_e), with the numbers of probes actually answered.

    A question with no answered positive (or negative) probe gets NaN: it cannot be judged and is never selected.
    """
    pos_n = np.asarray(pos_n, dtype=np.float64)
    neg_n = np.asarray(neg_n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.asarray(pos_yes) / pos_n - np.asarray(neg_yes) / neg_n
    q[(pos_n == 0) | (neg_n == 0)] = np.nan
    return q


def text_filters(questions: list[str], filters: list[str] | tuple[str, ...], max_words: int, copied: np.ndarray,
                 stopped_last: np.ndarray, examples: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Per question, the first text filter that drops it ("copy", "example", "long", "cut_off") or "" (kept).
    ``copied``: whether it shares a run of 6 words with a text the run read; ``stopped_last``: whether it is the last
    item of a reply that stopped on the token limit; ``examples``: the worked examples' questions the prompt showed."""
    from cqg_ray.cqg.quality import copied as shares_run, cut_off, words

    echoed = shares_run(list(questions), examples) if "example" in filters and examples else np.zeros(len(questions), bool)
    example_words = {tuple(words(e)) for e in examples}
    out = []
    for q, cp, last, ec in zip(questions, copied, stopped_last, echoed):
        if "copy" in filters and cp:
            out.append("copy")
        elif "example" in filters and (ec or tuple(words(q)) in example_words):
            out.append("example")
        elif "long" in filters and len(words(q)) > max_words:
            out.append("long")
        elif "cut_off" in filters and (cut_off(q) or last):
            out.append("cut_off")
        else:
            out.append("")
    return out


def own_cluster_no(pos_yes: np.ndarray, pos_n: np.ndarray, share: float = 0.5, q: np.ndarray | None = None,
                   min_quality: float | None = None) -> np.ndarray:
    """Questions answered yes for at most ``share`` of their own cluster's (answered) positive probes, or (with
    ``min_quality``) whose Eq. 1 quality ``q`` is at or below it: not a property of the cluster. Unprobed: not judged."""
    pos_yes, pos_n = np.asarray(pos_yes, dtype=np.float64), np.asarray(pos_n, dtype=np.float64)
    probed = pos_n > 0
    no = probed & ~(pos_yes > share * pos_n + 1e-9)
    if min_quality is not None:  # NaN quality (no negative probe answered) is not above the floor
        no |= probed & ~(np.asarray(q, dtype=np.float64) > min_quality + 1e-9)
    return no


def top_t(clusters: np.ndarray, q: np.ndarray, t: int) -> np.ndarray:
    """Indices of the t best questions of each cluster (NaN quality never selected), sorted by index."""
    clusters = np.asarray(clusters)
    q = np.asarray(q, dtype=np.float64)
    idx = np.arange(len(q))
    valid = ~np.isnan(q)
    # sort by cluster, then quality descending, then index ascending
    order = np.lexsort((idx[valid], -q[valid], clusters[valid]))
    sel_idx = idx[valid][order]
    sel_cl = clusters[valid][order]
    rank = np.arange(len(sel_cl)) - np.searchsorted(sel_cl, sel_cl, side="left")
    return np.sort(sel_idx[rank < t])


def quality_medians(q: np.ndarray, kept: np.ndarray) -> dict[str, float | None]:
    """Median Eq. 1 quality of the kept questions and of the probed questions that were not kept."""
    q, kept = np.asarray(q, dtype=np.float64), np.asarray(kept, dtype=bool)
    probed = ~np.isnan(q)

    def med(mask):
        return round(float(np.median(q[mask])), 4) if mask.any() else None

    return {"quality_median_kept": med(probed & kept), "quality_median_dropped": med(probed & ~kept)}


def priority_order(q: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Candidates from best to worst quality (ties: lower index first)."""
    candidates = np.asarray(candidates)
    return candidates[np.lexsort((candidates, -np.asarray(q)[candidates]))]


def dedup(emb: np.ndarray, order: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Greedy dedup in ``order``: keep a question unless its cosine with a kept one is > theta.

    ``emb``: (m, d) embeddings of all questions (rows need not be normalised). Returns
    (kept indices in ``order`` order, duplicate_of: for each question the kept question that removed it, -1 otherwise).
    """
    import faiss

    order = np.asarray(order, dtype=np.int64)
    duplicate_of = np.full(len(emb), -1, dtype=np.int64)
    if len(order) == 0:
        return order, duplicate_of
    x = np.ascontiguousarray(emb[order], dtype=np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    lims, sims, ids = index.range_search(x, float(theta))  # pairs with inner product > theta
    kept = np.zeros(len(order), dtype=bool)
    for pos in range(len(order)):
        nb = ids[lims[pos]: lims[pos + 1]]
        nbs = sims[lims[pos]: lims[pos + 1]]
        earlier = nb[(nb < pos) & (nbs > theta)]
        earlier = earlier[kept[earlier]]
        if len(earlier):
            duplicate_of[order[pos]] = order[earlier.min()]
        else:
            kept[pos] = True
    return order[kept], duplicate_of


def select(clusters: np.ndarray, q: np.ndarray, emb: np.ndarray, t: int, theta: float, openings: list[str] | None = None,
           max_opening_share: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Top ``t`` per cluster by quality (NaN never chosen), greedy dedup at ``theta``, and with ``openings`` the
    opening cap (see the module docstring). Returns (chosen: the last round's top-t, kept in priority order,
    duplicate_of, capped: the questions the opening cap dropped)."""
    q = np.asarray(q, dtype=np.float64)
    capped = np.zeros(len(q), dtype=bool)
    while True:
        chosen = top_t(clusters, np.where(capped, np.nan, q), t)
        kept, dup_of = dedup(emb, priority_order(q, chosen), theta)
        if openings is None or max_opening_share >= 1.0 or len(kept) == 0:
            return chosen, kept, dup_of, capped
        cap = max(1, int(np.floor(max_opening_share * len(kept))))
        over = []
        by_opening: dict[str, list[int]] = {}
        for i in kept.tolist():  # best first
            by_opening.setdefault(openings[i], []).append(i)
        for members in by_opening.values():
            over.extend(members[cap:])
        if not over:
            return chosen, kept, dup_of, capped
        capped[over] = True
