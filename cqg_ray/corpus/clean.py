"""The per-text rules of the corpus: cleaning, the text hash (ids, dedup), the sampling key, exact dedup.

Sampling (``corpus.limit``) keeps the ``limit`` documents with the smallest ``sample_key`` (a seeded hash of the doc
id), so it depends on no order and needs no global list: ``sample_cut`` finds the limit-th smallest key from a
histogram of the keys (``key_bins``: counts from the workers) and the few keys of the one bin it falls in.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa

from cqg_ray.texts import blank


def text_hash(text: str) -> str:
    """The first 16 hex digits of sha1(text): a text's id when no id column is named, and its dedup key."""
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def sample_key(doc_id: str, seed: int) -> float:
    """A deterministic pseudo-random number in [0, 1) per document, for order-independent sampling."""
    h = hashlib.sha1(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def sample_keys(doc_ids, seed: int) -> np.ndarray:
    """``sample_key`` of each document (float64)."""
    return np.array([sample_key(d, seed) for d in doc_ids], dtype=np.float64)


SAMPLE_BINS = 4096  # histogram bins of the sample keys: the bin of the cut holds ~N / 4096 keys


def key_bins(keys: np.ndarray, bins: int = SAMPLE_BINS) -> np.ndarray:
    """The histogram bin of each key in [0, 1) (``bins`` equal bins; exact for a power of two)."""
    return np.minimum((np.asarray(keys, np.float64) * bins).astype(np.int64), bins - 1)


def cut_bin(hist: np.ndarray, limit: int) -> tuple[int, int]:
    """(the bin that holds the limit-th smallest key, how many keys lie in the bins below it)."""
    cum = np.cumsum(hist)
    if limit < 1 or limit > cum[-1]:
        raise ValueError(f"limit {limit} outside 1..{int(cum[-1])}")
    b = int(np.searchsorted(cum, limit))
    return b, int(cum[b - 1]) if b else 0


def sample_cut(keys_in_bin: np.ndarray, limit: int, below: int) -> float:
    """The limit-th smallest key of all, from the keys of its bin and the count below that bin: the same value as
    ``np.partition(keys, limit - 1)[limit - 1]`` over every key."""
    return float(np.sort(np.asarray(keys_in_bin, np.float64))[limit - below - 1])


def clean_text(text: Any, min_chars: int = 1, max_chars: int | None = None) -> str | None:
    """Strip; None if blank (`texts.blank`), too short or not a string; truncate to max_chars."""
    if not isinstance(text, str):
        return None
    text = text.replace("\x00", "").strip()
    if len(text) < min_chars or blank(text):
        return None
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars]
    return text


def dedup_table(table: pa.Table) -> tuple[pa.Table, int]:
    """Keep the first occurrence (by source, line) of each text hash. Returns (table, duplicates dropped)."""
    if table.num_rows == 0:
        return table, 0
    order = table.sort_by([("text_hash", "ascending"), ("source", "ascending"), ("line", "ascending")])
    h = order.column("text_hash").to_numpy(zero_copy_only=False)
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = h[1:] != h[:-1]
    return order.filter(pa.array(keep)), int((~keep).sum())


def shard_bounds(n: int, shards: int) -> list[int]:
    """Where ``shards`` ordered, equal splits of ``n`` rows begin and end (``i * n // shards``: as Ray Data's
    ``repartition(shards, shuffle=False)`` cuts them)."""
    return [i * n // shards for i in range(shards + 1)]


def prepared_shards(table: pa.Table, dedup: bool, limit: int | None, seed: int, rows_per_shard: int) -> tuple[list[pa.Table], int]:
    """The parsed rows (with ``text_hash``) as the prepare stage writes them, in memory: deduplicated (``dedup_table``),
    the ``limit`` documents with the smallest ``sample_key`` kept, sorted by doc id and cut into the fewest equal,
    ordered shards of at most ``rows_per_shard`` rows; and the documents before sampling."""
    if dedup:
        table, _ = dedup_table(table)
    table = table.drop_columns(["text_hash"])
    n_docs = table.num_rows
    if not n_docs:
        return [], 0
    if limit is not None and n_docs > limit:
        keys = sample_keys(table.column("doc_id").to_pylist(), seed)
        table = table.filter(pa.array(keys <= np.partition(keys, limit - 1)[limit - 1]))
    table = table.sort_by("doc_id")
    bounds = shard_bounds(table.num_rows, -(-table.num_rows // rows_per_shard))
    return [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], n_docs
