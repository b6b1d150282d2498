"""Evaluation data loaders for the three layouts of ``../shared/data`` (and any path or URI in the same layout).

    load_sts("…/sts/STSBenchmark.test.tsv", max_pairs=200)           -> StsData
    load_beir("…/retrieval/scifact", max_queries=50, max_docs=1000)  -> RetrievalData
    load_clustering("…/clustering/twentynewsgroups.jsonl.gz", field="subject", max_docs=500) -> ClusteringData

Layouts
- STS: a TSV with a header naming ``sentence1``, ``sentence2``, ``score`` (other columns ignored); a file whose
  first row already parses as a score in the third column is read as headerless ``sentence1, sentence2, score``.
  Fields are split on tabs only (quotes are text, as in the official STS files).
- Retrieval (BEIR): a folder with ``corpus.jsonl`` {_id, title, text}, ``queries.test.jsonl`` or ``queries.jsonl``
  {_id, text}, ``qrels/test.tsv`` (header ``query-id corpus-id score``). A document's text is ``title + " " + text``
  (stripped), as MTEB feeds BEIR corpora to encoders. Where a query is also a corpus document under the same id
  (ArguAna, Quora), that document is left out of the query's ranking unless ``drop_identical_ids=False``. Relevant
  documents that the qrels name and the corpus lacks count as not retrieved, said once (a warning) and counted
  (``qrels_docs_missing``); where the corpus has none of them, the set is a DataError.
- Clustering: JSONL, optionally gzip-compressed, one object per line with a text field (``text`` by default;
  20 Newsgroups also has ``subject``, what MTEB's TwentyNewsgroupsClustering clusters) and ``label``.

Subsets are random (seeded) but keep the file order, because the files are sorted (20 Newsgroups by group,
STS by source): the first N rows would be a biased slice. A retrieval subset keeps every relevant document
of the chosen queries and fills the rest with seeded random distractors; ``full_corpus`` records whether the
corpus was cut.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from cqg_ray.rundir import resolve
from cqg_ray.textfiles import DataError, dataset_name, plain_name, read_jsonl, read_text_lines, read_tsv_rows, sample_indices

log = logging.getLogger("cqg_ray")

def _exists(uri: str) -> bool:
    fs, path = resolve(uri)
    return fs.get_file_info(path).type == pafs.FileType.File


def _join(folder: str, *parts: str) -> str:
    return "/".join([folder.rstrip("/"), *parts])


def sample_of(rng: np.random.Generator, members: np.ndarray, k: int) -> np.ndarray:
    """At most ``k`` of ``members`` (e.g. question indices), a uniform draw of ``rng`` without replacement, sorted."""
    return np.sort(rng.choice(members, size=min(k, len(members)), replace=False)) if len(members) else members


# ----------------------------------------------------------------------------------------- STS


@dataclass
class StsData:
    """Sentence pairs with gold similarity scores (any scale; only ranks matter for Spearman)."""

    name: str
    path: str
    sentence1: list[str]
    sentence2: list[str]
    scores: np.ndarray  # (n,) float64

    def __len__(self) -> int:
        return len(self.scores)

    def unique_texts(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(texts, i1, i2): each distinct sentence once, and where each pair's sentences are in ``texts``."""
        index: dict[str, int] = {}
        for s in [*self.sentence1, *self.sentence2]:
            index.setdefault(s, len(index))
        i1 = np.array([index[s] for s in self.sentence1], dtype=np.int64)
        i2 = np.array([index[s] for s in self.sentence2], dtype=np.int64)
        return list(index), i1, i2


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def load_sts(uri: str, max_pairs: int | None = None, seed: int = 0, name: str | None = None) -> StsData:
    """Read an STS TSV (header ``sentence1 sentence2 score ...``, or headerless first three columns)."""
    if plain_name(uri).endswith(".csv"):  # read by tabs, its header was one field
        raise DataError(f"{uri}: STS pairs are read from a TSV (sentence1, sentence2 and score separated by tabs), not a CSV")
    rows = read_tsv_rows(uri)
    if not rows:
        raise DataError(f"{uri}: empty STS file")
    head = rows[0][1]
    if len(head) >= 3 and _is_number(head[2]):
        cols, body = (0, 1, 2), rows
    else:
        missing = [c for c in ("sentence1", "sentence2", "score") if c not in head]
        if missing:
            raise DataError(f"{uri}: STS header must name sentence1, sentence2, score; missing {missing} in {head}")
        cols, body = (head.index("sentence1"), head.index("sentence2"), head.index("score")), rows[1:]
    s1, s2, scores = [], [], []
    for i, fields in body:
        if len(fields) <= max(cols):
            raise DataError(f"{uri}:{i}: expected at least {max(cols) + 1} tab-separated fields, got {len(fields)}")
        try:
            score = float(fields[cols[2]])
        except ValueError:
            raise DataError(f"{uri}:{i}: score {fields[cols[2]]!r} is not a number") from None
        if not np.isfinite(score):  # a NaN made the whole file's Spearman n/a, an inf ranked as the highest score
            raise DataError(f"{uri}:{i}: score {fields[cols[2]]!r} is not a finite number")
        s1.append(fields[cols[0]])
        s2.append(fields[cols[1]])
        scores.append(score)
    if not scores:
        raise DataError(f"{uri}: no sentence pairs")
    keep = sample_indices(len(scores), max_pairs, seed)
    return StsData(
        name=name or dataset_name(uri),
        path=uri,
        sentence1=[s1[i] for i in keep],
        sentence2=[s2[i] for i in keep],
        scores=np.asarray(scores, dtype=np.float64)[keep],
    )


# ----------------------------------------------------------------------------------------- plain texts (faithfulness)


# ----------------------------------------------------------------------------------------- retrieval (BEIR)


@dataclass
class RetrievalData:
    """A BEIR-style retrieval set: corpus, queries, graded relevance judgements."""

    name: str
    path: str
    doc_ids: list[str]
    docs: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}
    full_corpus: bool = True
    drop_identical_ids: bool = True  # BEIR's ignore_identical_ids: a retrieved doc with the query's own id is not scored
    qrels_docs: int = 0  # relevant documents the kept queries' qrels name
    qrels_docs_missing: int = 0  # of them, not in the corpus file: never retrieved, so they lower the score

    @property
    def identical_ids(self) -> int:
        """How many queries are also corpus documents under the same id (ArguAna, Quora)."""
        docs = set(self.doc_ids)
        return sum(q in docs for q in self.query_ids)


def doc_text(row: dict[str, Any]) -> str:
    """MTEB's text for a BEIR document: title and text joined by a space."""
    return f"{row.get('title') or ''} {row.get('text') or ''}".strip()


def read_qrels(uri: str) -> dict[str, dict[str, int]]:
    lines = [ln for ln in read_text_lines(uri) if ln.strip()]
    qrels: dict[str, dict[str, int]] = {}
    for i, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if i == 1 and not _is_number(fields[-1]):
            continue  # header
        if len(fields) < 3:
            raise DataError(f"{uri}:{i}: expected query-id, corpus-id, score")
        try:
            rel = int(float(fields[2]))
        except (ValueError, OverflowError):  # int(inf) overflows
            raise DataError(f"{uri}:{i}: relevance {fields[2]!r} is not a finite number") from None
        qrels.setdefault(fields[0], {})[fields[1]] = rel
    return qrels


def load_beir(
    folder: str,
    split: str = "test",
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
    name: str | None = None,
    drop_identical_ids: bool = True,
) -> RetrievalData:
    """Read a BEIR folder. Only queries with judgements in ``qrels/<split>.tsv`` are kept (BEIR's protocol).
    ``drop_identical_ids``: score rankings without the document whose id is the query's (BEIR's default)."""
    qrels_uri = _join(folder, "qrels", f"{split}.tsv")
    if not _exists(qrels_uri):
        raise DataError(f"{folder}: no qrels/{split}.tsv (BEIR layout: corpus.jsonl, queries.jsonl, qrels/{split}.tsv)")
    qrels = read_qrels(qrels_uri)
    queries_uri = next((u for u in (_join(folder, f"queries.{split}.jsonl"), _join(folder, "queries.jsonl")) if _exists(u)), None)
    if queries_uri is None:
        raise DataError(f"{folder}: no queries.{split}.jsonl or queries.jsonl")
    corpus_uri = _join(folder, "corpus.jsonl")
    if not _exists(corpus_uri):
        raise DataError(f"{folder}: no corpus.jsonl")

    query_text = {}
    for row in read_jsonl(queries_uri):
        if "_id" not in row or not isinstance(row.get("text"), str):
            raise DataError(f"{queries_uri}: every query needs an _id and a string text (keys: {sorted(row)[:8]})")
        query_text[str(row["_id"])] = row["text"]
    query_ids = [q for q in query_text if q in qrels]
    if not query_ids:
        raise DataError(f"{folder}: no query in {queries_uri} has judgements in {qrels_uri}")
    query_ids = [query_ids[i] for i in sample_indices(len(query_ids), max_queries, seed)]

    doc_ids, docs = [], []
    for row in read_jsonl(corpus_uri):
        if "_id" not in row:
            raise DataError(f"{corpus_uri}: every document needs an _id")
        if not any(isinstance(row.get(k), str) for k in ("title", "text")):  # an empty string is kept, as MTEB keeps it
            raise DataError(f"{corpus_uri}: document {row['_id']!r} has neither a string text nor a string title (keys: {sorted(row)[:8]})")
        doc_ids.append(str(row["_id"]))
        docs.append(doc_text(row))
    if not doc_ids:  # every query scored 0.00, as if the model had ranked badly
        raise DataError(f"{corpus_uri}: no documents")
    relevant = {d for q in query_ids for d, r in qrels[q].items() if r > 0}
    missing = relevant - set(doc_ids)
    if relevant and missing == relevant:  # every query would score 0.00, as if the model had ranked badly
        raise DataError(f"{folder}: none of the {len(relevant)} relevant documents that qrels/{split}.tsv names is in "
                        f"corpus.jsonl (qrels name e.g. {sorted(missing)[:3]}, the corpus has e.g. {doc_ids[:3]})")
    if missing:
        log.warning("%s: %s", folder, missing_docs_note(len(missing), len(relevant)))

    full = max_docs is None or max_docs >= len(doc_ids)
    if not full:
        must = [i for i, d in enumerate(doc_ids) if d in relevant]
        rest = np.array([i for i, d in enumerate(doc_ids) if d not in relevant], dtype=np.int64)
        extra = rest[sample_indices(len(rest), max(max_docs - len(must), 0), seed + 1)]
        keep = np.sort(np.concatenate([np.asarray(must, dtype=np.int64), extra]))
        doc_ids = [doc_ids[i] for i in keep]
        docs = [docs[i] for i in keep]
    return RetrievalData(
        name=name or dataset_name(folder),
        path=folder,
        doc_ids=doc_ids,
        docs=docs,
        query_ids=query_ids,
        queries=[query_text[q] for q in query_ids],
        qrels={q: qrels[q] for q in query_ids},
        full_corpus=full,
        drop_identical_ids=drop_identical_ids,
        qrels_docs=len(relevant),
        qrels_docs_missing=len(missing),
    )


def missing_docs_note(missing: int, named: int) -> str:
    """What the log and the report say of relevant documents that a BEIR set's qrels name and its corpus lacks."""
    return (f"qrels name {missing} relevant document{'s' if missing != 1 else ''} that {'are' if missing != 1 else 'is'} "
            f"not in the corpus (of {named}): they count as not retrieved")


# ----------------------------------------------------------------------------------------- clustering


@dataclass
class ClusteringData:
    """Texts with their true group labels."""

    name: str
    path: str
    texts: list[str]
    labels: list[str]
    field: str = "text"

    @property
    def n_labels(self) -> int:
        return len(set(self.labels))


def load_clustering(
    uri: str,
    field: str = "text",
    label_field: str = "label",
    max_docs: int | None = None,
    seed: int = 0,
    name: str | None = None,
) -> ClusteringData:
    """Read a clustering JSONL(.gz): one {field: text, label_field: label} object per line."""
    texts, labels = [], []
    for i, row in enumerate(read_jsonl(uri), start=1):
        if field not in row or label_field not in row:
            raise DataError(f"{uri}: row {i} lacks {field!r} or {label_field!r} (keys: {sorted(row)})")
        texts.append(str(row[field] or ""))
        labels.append(str(row[label_field]))
    if not texts:
        raise DataError(f"{uri}: no rows")
    keep = sample_indices(len(texts), max_docs, seed)
    if len({labels[i] for i in keep}) < 2:  # k-means on one group scores nothing; said before any text is encoded
        sample = f" in the {len(keep)} texts sampled (max_docs {max_docs})" if len(keep) < len(texts) else ""
        raise DataError(f"{uri}: clustering needs at least two distinct {label_field!r} values; found one{sample}")
    base = name or dataset_name(uri)
    return ClusteringData(
        name=base if field == "text" else f"{base}-{field}",
        path=uri,
        texts=[texts[i] for i in keep],
        labels=[labels[i] for i in keep],
        field=field,
    )


# ----------------------------------------------------------------------------------------- defaults


def default_data_root() -> str | None:
    """Where the standard evaluation sets live: $CQG_RAY_DATA, else ../shared/data or ./data if present."""
    for root in (os.environ.get("CQG_RAY_DATA"), "../shared/data", "data"):
        if root and os.path.isdir(root):
            return root
    return None


def default_datasets(root: str) -> dict[str, list[str]]:
    """The standard sets under a data root (the layout of ../shared/data) that exist there."""
    cands = {
        "sts": [f"{root}/sts/STS12.test.tsv", f"{root}/sts/STS13.test.tsv", f"{root}/sts/STSBenchmark.test.tsv"],
        "retrieval": [f"{root}/retrieval/scifact"],
        "clustering": [f"{root}/clustering/twentynewsgroups.jsonl.gz"],
        "faithfulness": [f"{root}/sts/STSBenchmark.test.tsv"],
    }
    return {task: [p for p in paths if os.path.exists(p)] for task, paths in cands.items()}
