"""Search over embedded corpora: rank documents against a query by the model's own similarity.

Two indexes, by what `cqg-ray embed` wrote:
- ``SparseIndex`` (``--output sparse``, or probabilities under a budget): the budgeted value vectors, held as an
  inverted index (a ``scipy.sparse.csc_array``: per question, the documents where it is active and their values). A
  query touches only the postings of its own active questions: score = sum over them of q_i * x_i, divided by both
  norms (cosine).
- ``BinaryIndex`` (``--output bits``): packed 0/1 vectors, scored by popcounts.

For 0/1 answer vectors x, y (the m yes/no answers, packed 8 to a byte with `np.packbits`):

    cos(x, y) = |x AND y| / sqrt(|x| |y|)        (0 when either has no yes)

|x AND y| is the cognitive load of the pair (the questions both answer yes). Popcounts do all of it: the packed
bytes are viewed as uint64 words (zero-padded), `np.bitwise_count` counts bits, so scoring n documents costs
n * ceil(m/64) AND+popcount operations. Search is exact and streams over chunks (or files), keeping a running
top-k; ties are broken by corpus order, so results are deterministic.

The pure core is the project's one copy of ``cosine_scores`` (popcount cosine over packed rows); ``top_k`` (exact
top-k with ties) lives in ``cqg_ray.ranking``, below the stages that share it. Explanations of a pair live in
``cqg_ray.explain``.

    index = load_index("runs/demo/embeddings")                    # the OUT folder of `cqg-ray embed`
    hits = search(model, index, "a query text", k=10)             # Hit(doc_id, score, shared=[question indices], ...)
    index = SparseIndex(np.array(ids), model.encode(texts, output="sparse"), model.m)   # texts in memory
    cqg-ray search MODEL EMBEDDINGS "a query text" -k 10          # prints hits with their shared active questions
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from cqg_ray.texts import BLANK, blank, clipped, unicode_error
from cqg_ray.explain import reliability_note
from cqg_ray.artifacts import (HEADS_FILES, EMBED_MANIFEST, embed_manifest, embed_output_files, embed_output_texts, embedding_matrix,
                               model_fingerprint, read_embed_output, read_unit)
from cqg_ray.mbqa.budget import Budget, sparse_budget
from cqg_ray.ranking import top_k
from cqg_ray.rundir import ArtifactError, RunDir

# ----------------------------------------------------------------------------------------- pure core


def to_words(packed: np.ndarray) -> np.ndarray:
    """(n, nbytes) uint8 -> (n, ceil(nbytes/8)) uint64, zero-padded (padding adds no bits)."""
    packed = np.ascontiguousarray(np.atleast_2d(packed), dtype=np.uint8)
    n, nb = packed.shape
    pad = -nb % 8
    if pad:
        packed = np.concatenate([packed, np.zeros((n, pad), np.uint8)], axis=1)
    return packed.view(np.uint64)


def popcounts(words: np.ndarray) -> np.ndarray:
    """Number of yes answers |x| per row of a uint64 word matrix."""
    return np.bitwise_count(words).sum(axis=1, dtype=np.int64)


def cosine_scores(query_words: np.ndarray, words: np.ndarray, counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cosines float64, shared-yes counts int64) of one query (w,) against rows (n, w) of uint64 words."""
    inter = np.bitwise_count(words & query_words).sum(axis=1, dtype=np.int64)
    counts = popcounts(words) if counts is None else counts
    denom = np.sqrt((counts * int(np.bitwise_count(query_words).sum())).astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.where(denom > 0, inter / np.where(denom > 0, denom, 1.0), 0.0)
    return scores, inter


def shared_questions(query_packed: np.ndarray, doc_packed: np.ndarray, m: int) -> list[int]:
    """Indices of the questions that both answer yes."""
    both = np.unpackbits(np.asarray(query_packed, np.uint8) & np.asarray(doc_packed, np.uint8), count=m)
    return np.flatnonzero(both).tolist()


@dataclass
class Hit:
    rank: int
    doc_id: str
    score: float                      # cosine of the binary vectors
    cognitive_load: int               # number of questions both answer yes
    shared: list[int] = field(default_factory=list)           # their indices, surest first (bits: in index order)
    questions: list[str] = field(default_factory=list)        # their texts (filled by `search`)
    question_ids: list[str] = field(default_factory=list)     # their ids in questions.json, as explain and questions show them
    text: str | None = None
    precision: list[float | None] = field(default_factory=list)  # each shared question's measured precision (None: unmeasured)
    n_heldout: list[int | None] = field(default_factory=list)    # the held-out labels behind it (None: the model stores none)

    def name_questions(self, model) -> None:
        """Fill in the shared questions' texts and their measured reliability from the model's question records."""
        recs = [model.question_records[i] for i in self.shared]
        self.questions = [r["text"] for r in recs]
        self.question_ids = [str(r.get("id", i)) for r, i in zip(recs, self.shared)]
        self.precision = [r.get("precision") for r in recs]
        self.n_heldout = [r.get("n_heldout") for r in recs]


def search_chunks(query_packed: np.ndarray, chunks: Iterable[tuple[np.ndarray, np.ndarray]], m: int, k: int = 10) -> list[Hit]:
    """Exact top-k over a stream of (doc_ids, packed rows) chunks; memory: one chunk plus k candidates."""
    q = to_words(query_packed)[0]
    best_scores = np.zeros(0)
    best_ids = np.zeros(0, dtype=object)
    best_packed = np.zeros((0, len(np.atleast_1d(query_packed))), np.uint8)
    best_inter = np.zeros(0, dtype=np.int64)
    for ids, packed in chunks:
        if len(ids) == 0:
            continue
        scores, inter = cosine_scores(q, to_words(packed))
        _, keep = top_k(scores, k)
        # candidates so far come first, so on ties earlier chunks (earlier rows) win
        best_scores = np.concatenate([best_scores, scores[keep]])
        best_ids = np.concatenate([best_ids, np.asarray(ids, dtype=object)[keep]])
        best_packed = np.concatenate([best_packed, np.asarray(packed, np.uint8)[keep]])
        best_inter = np.concatenate([best_inter, inter[keep]])
        _, sel = top_k(best_scores, k)
        best_scores, best_ids, best_packed, best_inter = best_scores[sel], best_ids[sel], best_packed[sel], best_inter[sel]
    return [Hit(r + 1, str(d), float(s), int(c), shared_questions(query_packed, p, m))
            for r, (d, s, c, p) in enumerate(zip(best_ids, best_scores, best_inter, best_packed))]


# ----------------------------------------------------------------------------------------- index


def stored_budget(meta: dict) -> Budget:
    """The budget an embed output was made with (an output from before budgets: the tau rule at its tau)."""
    return Budget.from_dict(meta["budget"]) if "budget" in meta else Budget(rule="tau", tau=float(meta["tau"]))


class BinaryIndex:
    """Packed answer vectors of a corpus in memory (m/8 bytes a document), searched exactly by popcounts."""

    def __init__(self, doc_ids: np.ndarray, packed: np.ndarray, m: int, budget: Budget | None = None, source: str | None = None):
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape[1] != (m + 7) // 8:
            raise ValueError(f"packed embeddings must be (n, ceil(m/8)={(m + 7) // 8}), got {packed.shape}")
        if len(doc_ids) != len(packed):
            raise ValueError(f"{len(doc_ids)} ids for {len(packed)} embeddings")
        self.doc_ids = np.asarray(doc_ids, dtype=object)
        self.packed, self.m, self.budget, self.source = packed, m, budget, source
        self.words = to_words(packed)
        self.counts = popcounts(self.words)

    def __len__(self) -> int:
        return len(self.doc_ids)

    @classmethod
    def load(cls, out: str) -> "BinaryIndex":
        """The output folder of `cqg-ray embed --output bits`."""
        ids, matrix, meta = read_embed_output(out)
        if meta["output"] != "bits":
            raise ArtifactError(f"{out} holds {meta['output']} embeddings, not bits: load it with SparseIndex (or load_index)")
        return cls(ids, np.asarray(matrix, np.uint8), meta["m"], stored_budget(meta), out)

    def search(self, query_packed: np.ndarray, k: int = 10, chunk_rows: int = 65_536) -> list[Hit]:
        """Exact top-k by binary cosine, scored chunk_rows documents at a time."""
        q = to_words(query_packed)[0]
        if len(q) != self.words.shape[1]:
            raise ValueError(f"query has {len(np.atleast_1d(query_packed))} bytes, the index {self.packed.shape[1]}")

        def chunks():
            for i in range(0, len(self), chunk_rows):
                yield self.doc_ids[i : i + chunk_rows], self.packed[i : i + chunk_rows]

        return search_chunks(query_packed, chunks(), self.m, k)


def sparse_cosine_top_k(query: np.ndarray, X_csc, norms: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the k best rows of an inverted index ``X_csc`` (n, m) by cosine with a dense query (m,):
    only the query's nonzero columns (their postings) are read; exact, ties to the lower row."""
    q = np.asarray(query, dtype=np.float32)
    cols = np.flatnonzero(q)
    qn = float(np.linalg.norm(q))
    if not len(cols) or qn == 0:
        scores = np.zeros(X_csc.shape[0], dtype=np.float64)
    else:
        dots = np.asarray(X_csc[:, cols] @ q[cols], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.where(norms > 0, dots / (np.where(norms > 0, norms, 1.0) * qn), 0.0)
    return top_k(scores, k)


def surest_first(questions: np.ndarray, products: np.ndarray) -> list[int]:
    """Shared questions ranked as ``explain`` ranks them: by the product of the two texts' values (p_a * p_b where the
    values are probabilities), largest first, ties to the lower index."""
    return np.asarray(questions)[np.lexsort((questions, -products))].tolist()


class SparseIndex:
    """Budgeted value vectors of a corpus as an inverted index (``scipy.sparse.csc_array``): about 8 bytes an
    active question in memory, searched exactly by cosine over the postings of the query's active questions."""

    def __init__(self, doc_ids: np.ndarray, X, m: int, budget: Budget | None = None, source: str | None = None):
        import scipy.sparse as sp

        X = sp.csr_array(X, dtype=np.float32)
        if X.shape[1] != m:
            raise ValueError(f"sparse embeddings must have m={m} columns, got {X.shape[1]}")
        if len(doc_ids) != X.shape[0]:
            raise ValueError(f"{len(doc_ids)} ids for {X.shape[0]} embeddings")
        self.doc_ids = np.asarray(doc_ids, dtype=object)
        self.rows, self.m, self.budget, self.source = X, m, budget, source
        self.postings = X.tocsc()
        self.norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64)).ravel()

    def __len__(self) -> int:
        return len(self.doc_ids)

    @classmethod
    def load(cls, out: str, budget: Budget | None = None, mean: np.ndarray | None = None) -> "SparseIndex":
        """The output folder of `cqg-ray embed --output sparse`, or of ``--output probs`` as value vectors under
        ``budget`` (default: the one they were written with; ``mean``: the model's, for a budget that needs it)."""
        ids, X, meta = read_embed_output(out)
        if meta["output"] == "bits":
            raise ArtifactError(f"{out} holds bits, not value vectors: load it with BinaryIndex (or load_index)")
        if meta["output"] == "probs":
            budget = budget or stored_budget(meta)
            return cls(ids, sparse_budget(np.asarray(X, np.float32), budget, mean), meta["m"], budget, out)
        return cls(ids, X, meta["m"], stored_budget(meta), out)

    def search(self, query: np.ndarray, k: int = 10) -> list[Hit]:
        """Exact top-k by cosine of the value vectors; ``query``: the query's dense (m,) value vector. Each hit's shared
        questions come surest first (``surest_first``: by the product of the two values)."""
        q = np.asarray(query, dtype=np.float32).ravel()
        if len(q) != self.m:
            raise ValueError(f"query has {len(q)} dimensions, the index m={self.m}")
        scores, rows = sparse_cosine_top_k(q, self.postings, self.norms, k)
        hits = []
        for r, (row, score) in enumerate(zip(rows, scores)):
            start, stop = self.rows.indptr[row], self.rows.indptr[row + 1]
            cols, vals = self.rows.indices[start:stop], self.rows.data[start:stop]
            both = q[cols] != 0
            shared = surest_first(cols[both], vals[both].astype(np.float64) * q[cols[both]])
            hits.append(Hit(r + 1, str(self.doc_ids[row]), float(score), len(shared), shared))
        return hits


def load_index(out: str, budget: Budget | None = None, mean: np.ndarray | None = None) -> "SparseIndex | BinaryIndex":
    """The index of an embed output folder: bits as a ``BinaryIndex``, sparse outputs and probabilities (as value
    vectors under ``budget``, default the one they were written with) as a ``SparseIndex``."""
    meta = embed_manifest(out)
    return BinaryIndex.load(out) if meta["output"] == "bits" else SparseIndex.load(out, budget, mean)


def search_value_chunks(query: np.ndarray, chunks: Iterable[tuple[np.ndarray, object]], m: int, k: int = 10) -> list[Hit]:
    """Exact top-k by cosine of the value vectors over a stream of (doc_ids, value rows) chunks, as ``SparseIndex``
    scores them; ties to the earlier document; memory: one chunk plus k hits."""
    best: list[Hit] = []
    for ids, values in chunks:
        if len(ids):  # a stable sort with the hits so far first: on ties earlier chunks win
            best = sorted(best + SparseIndex(ids, values, m).search(query, k), key=lambda h: -h.score)[:k]
    for rank, h in enumerate(best, start=1):
        h.rank = rank
    return best


def file_chunks(out: str, budget: Budget | None = None, mean: np.ndarray | None = None) -> tuple[dict, Iterator[tuple[np.ndarray, object]]]:
    """(meta, a stream of (doc_ids, rows) per unit file) of a bits / probs embed output folder, to search without
    loading it all: bits packed as stored, probabilities as their value vectors under ``budget`` (default the one
    they were written with; a ``scipy.sparse.csr_array``)."""
    run = RunDir(out)
    files = embed_output_files(out)
    meta = run.read_json(EMBED_MANIFEST)
    b = budget or stored_budget(meta)

    def gen():
        for f in files:
            t = read_unit(run, f)
            matrix = embedding_matrix(t.column("embedding"))
            rows = np.asarray(matrix, np.uint8) if meta["output"] == "bits" else sparse_budget(np.asarray(matrix, np.float32), b, mean)
            yield t.column("doc_id").to_numpy(zero_copy_only=False), rows

    return meta, gen()


def search(model, index: "SparseIndex | BinaryIndex", query: str, k: int = 10) -> list[Hit]:
    """Embed `query` with the model (under the index's budget) and return the top-k hits with their shared questions."""
    if model.m != index.m:
        raise ValueError(f"the model has m={model.m} questions but the embeddings have m={index.m}")
    if blank(query):
        raise ValueError(f"the query is {BLANK}: it answers no question, so nothing is like it")
    if isinstance(index, SparseIndex):
        q = model.encode([query], output="sparse", budget=index.budget, progress=False).toarray()[0]
    else:
        q = model.encode([query], output="packed", budget=index.budget, progress=False)[0]
    hits = index.search(q, k)
    for h in hits:
        h.name_questions(model)
    return hits


# ----------------------------------------------------------------------------------------- CLI


def cmd_search(args) -> int:
    from cqg_ray.config import ConfigError
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    if args.k < 1:
        raise ConfigError(f"search: -k must be at least 1 (hits to show), got {args.k}")
    if args.tau is not None and not 0 < args.tau < 1:
        raise ConfigError(f"search: --tau must lie in (0, 1), got {args.tau}")
    if problem := unicode_error(args.query, "the query"):  # bytes the shell gave that are not UTF-8
        raise ConfigError(f"search: {problem}")
    if blank(args.query):
        raise ConfigError(f"search: the query is {BLANK}: it answers no question, so nothing is like it")
    meta = embed_manifest(args.embeddings)  # before the model loads: a wrong folder is said at once
    model = InterpretableEmbedder.load(args.model)
    if meta["m"] != model.m:
        raise ArtifactError(f"the model has m={model.m} questions but {args.embeddings} has m={meta['m']} (another model?)")
    made_by = meta.get("heads_fingerprint")  # embed outputs written before it was recorded have none
    if made_by is not None and made_by != model_fingerprint(model.path, HEADS_FILES):
        raise ArtifactError(f"{args.embeddings} was embedded by another model ({meta.get('model')}: other questions or heads than "
                            f"{args.model}): search it with that model, or embed the corpus with this one")
    if args.tau is not None and meta["output"] != "probs":
        raise ArtifactError(f"{args.embeddings} holds {meta['output']} made under {stored_budget(meta).name}; --tau applies to "
                            "probability embeddings only")
    budget = stored_budget(meta)
    if args.tau is not None:  # the tau rule valued as the stored budget values its answers, as explain --tau and encode(threshold=)
        budget = Budget(rule="tau", tau=args.tau, value=budget.value)
    if meta["output"] == "bits":
        q = model.encode([args.query], output="packed", budget=budget, progress=False)[0]
        hits = search_chunks(q, file_chunks(args.embeddings)[1], model.m, args.k)
        q_yes = np.flatnonzero(np.unpackbits(q, count=model.m)).tolist()
    else:  # value vectors: sparse ones as stored, probabilities under the budget one unit file at a time
        q = model.encode([args.query], output="sparse", budget=budget, progress=False).toarray()[0]
        hits = (SparseIndex.load(args.embeddings).search(q, args.k) if meta["output"] == "sparse"
                else search_value_chunks(q, file_chunks(args.embeddings, budget, model.mean)[1], model.m, args.k))
        q_yes = np.flatnonzero(q).tolist()
    texts = embed_output_texts(args.embeddings, [h.doc_id for h in hits])
    for h in hits:
        h.name_questions(model)
        h.text = texts.get(h.doc_id)
    if args.json:
        print(json.dumps({"query": args.query, "budget": budget.name, "query_yes": q_yes, "hits": [h.__dict__ for h in hits]}, indent=2))
        return 0
    print(f"query: {clipped(args.query, 200)!r}  ({len(q_yes)} of {model.m} questions active, budget {budget.name})")
    if not q_yes:
        print("the query has no active question: every score is 0")
    sharing = [h for h in hits if h.score > 0] if q_yes else hits  # a hit of score 0 shares no active question with the query
    for h in sharing:
        text = "" if h.text is None else "  " + clipped(h.text, 100)
        print(f"{h.rank:>3}. {h.score:.4f}  {h.doc_id}{text}")
        for qid, qt, prec, n in zip(h.question_ids, h.questions, h.precision, h.n_heldout):
            note = reliability_note(prec, n)
            print(f"       yes both  [{qid:>4}] {qt}" + (f"  ({note})" if note else ""))
    if len(sharing) < len(hits):
        print(f"no other document shares an active question with the query ({len(hits) - len(sharing)} of the top {args.k} score 0)")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("search", help="rank embedded documents against a query (cosine) with the shared active questions",
                       description="Exact top-k search over the output of `cqg-ray embed` by the model's own similarity: sparse "
                                   "outputs by the cosine of the budgeted value vectors over an inverted index, probabilities by "
                                   "the same cosine under the budget they were written with (or --tau), one unit file at a time, "
                                   "bits by binary cosine (popcounts); each hit lists the questions active for both it and the query.")
    p.add_argument("model", help="model folder or shipped model name (the one that embedded the corpus)")
    p.add_argument("embeddings", help="output folder of `cqg-ray embed`")
    p.add_argument("query", help="query text")
    p.add_argument("-k", type=int, default=10, help="hits to show (default 10)")
    p.add_argument("--tau", type=float, default=None, help="probability embeddings only: the tau rule (yes when p > tau) instead "
                                                           "of the budget they were written with, its answers valued as that "
                                                           "budget values them (0/1, the paper's vectors, for value one)")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(func=cmd_search)
