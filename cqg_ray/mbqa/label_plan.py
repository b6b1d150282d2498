"""The labelling plan of Appendix B (pure numpy): which texts each question is asked about, packed into prompts.

For each selected question q with source cluster c(q), the paper labels n_cluster texts from c(q), n_neighbor texts
from the `neighbor_clusters` nearest clusters of c(q), and n_random texts from the whole corpus (500/300/200), and
asks the LLM up to 20 questions per prompt about one text.

Sampling rule (seeded by ``LabelConfig.seed``; every question's sample is a uniform random sample of its sources,
with no text twice for the same question):

- own cluster: the first n_cluster texts of a random permutation pi_c of cluster c, the same permutation for every
  question of that cluster;
- neighbours: the quota is split evenly over the nearest clusters (nearest first for the remainder) and each
  neighbour j gives the first texts of its own pi_j;
- random: consecutive windows of a pool walked cyclically in a random order, skipping texts the question already has.
  ``random_from: labelled`` (default): the pool is every text some question already takes from its own or its
  neighbours' clusters (a uniform random text of that set, which spans every cluster that has questions), so random
  pairs land on texts that are labelled anyway and each text serves more questions; ``corpus``: the pool is the front
  of one random permutation of the whole corpus, ceil(total random quota / questions_per_prompt) texts. (A labelled
  set smaller than that is topped up from the corpus permutation.)

Drawing every question's texts from the *fronts* of shared permutations (instead of independently) makes questions
that look at the same cluster ask about the same texts, so that their pairs pack into far fewer prompts (the LLM
calls are the expensive part); each question's own sample is still uniformly random.

Small clusters: a shortfall moves down the line. If cluster c has fewer than n_cluster texts, all of them are used
and the rest of the quota is added to the neighbour quota; if the neighbour clusters together cannot fill that, the
remainder is added to the random quota; random texts are limited by the corpus. A question therefore gets
min(n_cluster + n_neighbor + n_random, n_docs) distinct texts. A question without a source cluster (cluster -1, for
example QAEmb questions) takes its whole quota at random.

Packing: the (text, question) pairs are grouped by text; each text's questions (sorted) are cut into prompts of at
most `questions_per_prompt`. Every planned pair is asked exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import ClusterIndex
from cqg_ray.config import LabelConfig

SOURCE_CLUSTER, SOURCE_NEIGHBOR, SOURCE_RANDOM = 0, 1, 2


@dataclass
class LabelPlan:
    """The planned pairs and their packing into prompts.

    pairs (sorted by question, then text):  pair_question (int32), pair_doc (int64), pair_source (int8: 0 own
    cluster, 1 neighbour, 2 random).
    prompts (sorted by text): prompt_doc (P,) int64 and CSR rows prompt_offsets (P+1,) into prompt_questions
    (int32), so prompt i asks questions prompt_questions[prompt_offsets[i]:prompt_offsets[i+1]] about text prompt_doc[i].
    Questions and texts are row indices (into the selected question table and the corpus).
    """

    pair_question: np.ndarray
    pair_doc: np.ndarray
    pair_source: np.ndarray
    prompt_doc: np.ndarray
    prompt_offsets: np.ndarray
    prompt_questions: np.ndarray

    @property
    def n_pairs(self) -> int:
        return len(self.pair_doc)

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_doc)

    def questions_of(self, prompt: int) -> np.ndarray:
        return self.prompt_questions[self.prompt_offsets[prompt] : self.prompt_offsets[prompt + 1]]

    def prompts_table(self) -> pa.Table:
        """prompt_id, doc_index, question_index (list<int32>): one row per LLM prompt."""
        questions = pa.ListArray.from_arrays(pa.array(self.prompt_offsets.astype(np.int32)), pa.array(self.prompt_questions))
        return pa.table({"prompt_id": np.arange(self.n_prompts, dtype=np.int64), "doc_index": self.prompt_doc, "question_index": questions})

    def pairs_table(self) -> pa.Table:
        """question_index, doc_index, source: one row per planned (question, text) pair."""
        return pa.table({"question_index": self.pair_question, "doc_index": self.pair_doc, "source": self.pair_source})

    def counts(self) -> dict:
        per_q = np.bincount(self.pair_question) if self.n_pairs else np.zeros(0, dtype=np.int64)
        return {
            "pairs": self.n_pairs,
            "prompts": self.n_prompts,
            "docs": int(len(np.unique(self.pair_doc))),
            "pairs_per_prompt": round(self.n_pairs / max(self.n_prompts, 1), 3),
            "pairs_own_cluster": int((self.pair_source == SOURCE_CLUSTER).sum()),
            "pairs_neighbor": int((self.pair_source == SOURCE_NEIGHBOR).sum()),
            "pairs_random": int((self.pair_source == SOURCE_RANDOM).sum()),
            "min_pairs_per_question": int(per_q.min()) if len(per_q) else 0,
            "max_pairs_per_question": int(per_q.max()) if len(per_q) else 0,
        }


def _split_evenly(quota: int, sizes: np.ndarray) -> np.ndarray:
    """Take `quota` items from groups of `sizes`: equal shares (remainder to the first groups), a group that is too
    small gives all it has and its shortfall is shared by the others. Returns the count taken from each group."""
    take = np.zeros(len(sizes), dtype=np.int64)
    left = quota
    open_ = sizes > 0
    while left > 0 and open_.any():
        idx = np.flatnonzero(open_)
        share = np.full(len(idx), left // len(idx))
        share[: left % len(idx)] += 1
        share = np.minimum(share, sizes[idx] - take[idx])
        take[idx] += share
        left -= int(share.sum())
        open_ = take < sizes
    return take


def make_label_plan(
    assignments: np.ndarray,
    neighbors: np.ndarray,
    question_clusters: np.ndarray,
    cfg: LabelConfig,
) -> LabelPlan:
    """Plan the labelling pairs and pack them into prompts.

    assignments: (n_docs,) cluster of each text (-1 = none); neighbors: (k, n_neighbors) nearest clusters of each
    cluster, nearest first (the cluster itself and -1 entries are ignored); question_clusters: (m,) source cluster of
    each question (-1 = none).
    """
    assignments = np.asarray(assignments, dtype=np.int64)
    neighbors = np.asarray(neighbors, dtype=np.int64)
    question_clusters = np.asarray(question_clusters, dtype=np.int64)
    n_docs, m = len(assignments), len(question_clusters)
    if neighbors.ndim != 2:
        raise ValueError(f"neighbors must be a (k, n_neighbors) table, got shape {neighbors.shape}")
    k = max(neighbors.shape[0], int(assignments.max()) + 1 if n_docs else 0)
    if neighbors.shape[0] < k:
        raise ValueError(f"neighbors has {neighbors.shape[0]} rows but assignments name cluster {k - 1}")
    if m and (question_clusters.max() >= k or question_clusters.min() < -1):
        raise ValueError(f"question_clusters must lie in [-1, {k - 1}]")
    if n_docs == 0 or m == 0:
        empty = np.zeros(0, dtype=np.int64)
        return LabelPlan(empty.astype(np.int32), empty, empty.astype(np.int8), empty, np.zeros(1, dtype=np.int64), empty.astype(np.int32))

    rng = np.random.default_rng(cfg.seed)
    index = ClusterIndex.build(assignments, k, rng)  # pi_c for every cluster at once: a random order inside each cluster
    sizes = index.sizes
    corpus_perm = rng.permutation(n_docs)

    def front(c: int, n: int) -> np.ndarray:
        return index.members(c)[:n]

    # quotas per question (own -> neighbours -> random spill-over) and the own/neighbour picks
    picks: list[np.ndarray] = []
    sources: list[np.ndarray] = []
    random_quota = np.zeros(m, dtype=np.int64)
    total = cfg.n_cluster + cfg.n_neighbor + cfg.n_random
    for q, c in enumerate(question_clusters):
        own = np.zeros(0, dtype=np.int64)
        neigh = np.zeros(0, dtype=np.int64)
        if c >= 0:
            own = front(c, min(cfg.n_cluster, int(sizes[c])))
            nbrs = [int(j) for j in neighbors[c] if j >= 0 and j != c][: cfg.neighbor_clusters]
            want = cfg.n_neighbor + cfg.n_cluster - len(own)
            take = _split_evenly(want, sizes[nbrs]) if nbrs else np.zeros(0, dtype=np.int64)
            neigh = np.concatenate([front(j, int(t)) for j, t in zip(nbrs, take)] or [neigh])
        random_quota[q] = min(total, n_docs) - len(own) - len(neigh)
        picks.append(np.concatenate([own, neigh]))
        sources.append(np.concatenate([np.full(len(own), SOURCE_CLUSTER, np.int8), np.full(len(neigh), SOURCE_NEIGHBOR, np.int8)]))

    # random texts: cyclic windows over a pool walked in a random order: the texts already labelled for some question
    # (cfg.random_from == "labelled", so they serve more questions) or the front of one corpus permutation ("corpus")
    if cfg.random_from == "labelled":
        labelled = np.unique(np.concatenate(picks)) if picks else np.zeros(0, dtype=np.int64)
        in_pool = np.zeros(n_docs, dtype=bool)
        in_pool[labelled] = True
        walk = np.concatenate([corpus_perm[in_pool[corpus_perm]], corpus_perm[~in_pool[corpus_perm]]])  # labelled texts first
        pool = int(min(n_docs, max(random_quota.max(), len(labelled), -(-int(random_quota.sum()) // cfg.questions_per_prompt))))
    else:
        walk = corpus_perm
        pool = int(min(n_docs, max(random_quota.max(), -(-int(random_quota.sum()) // cfg.questions_per_prompt))))
    cursor = 0
    for q in range(m):
        need = int(random_quota[q])
        if need <= 0:
            continue
        have = np.sort(picks[q])
        window = walk[(cursor + np.arange(min(pool, need + len(have)))) % pool]
        got = window[~np.isin(window, have, assume_unique=True)][:need]
        if len(got) < need:  # the pool is exhausted for this question: continue into the rest of the corpus
            rest = walk[pool:]
            extra = rest[~np.isin(rest, have, assume_unique=True)][: need - len(got)]
            got = np.concatenate([got, extra])
        cursor = (cursor + need) % pool
        picks[q] = np.concatenate([picks[q], got])
        sources[q] = np.concatenate([sources[q], np.full(len(got), SOURCE_RANDOM, np.int8)])

    lengths = np.array([len(p) for p in picks], dtype=np.int64)
    pair_question = np.repeat(np.arange(m, dtype=np.int32), lengths)
    pair_doc = np.concatenate(picks).astype(np.int64)
    pair_source = np.concatenate(sources).astype(np.int8)
    by_q = np.lexsort((pair_doc, pair_question))
    pair_question, pair_doc, pair_source = pair_question[by_q], pair_doc[by_q], pair_source[by_q]
    prompt_doc, prompt_offsets, prompt_questions = pack_prompts(pair_doc, pair_question, cfg.questions_per_prompt)
    return LabelPlan(pair_question, pair_doc, pair_source, prompt_doc, prompt_offsets, prompt_questions)


def pack_prompts(pair_doc: np.ndarray, pair_question: np.ndarray, questions_per_prompt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group (text, question) pairs by text and cut each text's sorted questions into prompts of at most
    `questions_per_prompt`. Returns (prompt_doc (P,), prompt_offsets (P+1,), prompt_questions (n_pairs,))."""
    if questions_per_prompt < 1:
        raise ValueError("questions_per_prompt must be >= 1")
    pair_doc = np.asarray(pair_doc, dtype=np.int64)
    pair_question = np.asarray(pair_question, dtype=np.int32)
    order = np.lexsort((pair_question, pair_doc))
    doc, question = pair_doc[order], pair_question[order]
    n = len(doc)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32)
    if np.any((doc[1:] == doc[:-1]) & (question[1:] == question[:-1])):
        raise ValueError("duplicate (text, question) pairs in the plan")
    doc_start = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
    rank = np.arange(n) - np.repeat(doc_start, np.diff(np.r_[doc_start, n]))  # position inside the text's group
    starts = np.flatnonzero(rank % questions_per_prompt == 0)
    return doc[starts], np.r_[starts, n].astype(np.int64), question


def holdout_docs(doc_index: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """The held-out documents: round(fraction * #distinct labelled docs) of them, chosen by a seeded permutation.

    Split by document, never by pair, so no held-out text is seen in training. Returns the sorted held-out doc ids.
    """
    docs = np.unique(np.asarray(doc_index, dtype=np.int64))
    n_out = int(round(fraction * len(docs)))
    if fraction > 0 and len(docs) > 1:
        n_out = min(max(n_out, 1), len(docs) - 1)  # at least one held out, at least one to train on
    rng = np.random.default_rng([seed, 0x484F4C44])  # "HOLD": independent of the plan's stream
    return np.sort(rng.permutation(docs)[:n_out])
