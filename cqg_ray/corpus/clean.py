"""The per-text rules of the corpus: cleaning, the text hash (ids, dedup), the sampling key, exact dedup."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa


def text_hash(text: str) -> str:
    """The first 16 hex digits of sha1(text): a text's id when no id column is named, and its dedup key."""
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def sample_key(doc_id: str, seed: int) -> float:
    """A deterministic pseudo-random number in [0, 1) per document, for order-independent sampling."""
    h = hashlib.sha1(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def clean_text(text: Any, min_chars: int = 1, max_chars: int | None = None) -> str | None:
    """Strip; None if empty/too short or not a string; truncate to max_chars."""
    if not isinstance(text, str):
        return None
    text = text.replace("\x00", "").strip()
    if len(text) < min_chars:
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
