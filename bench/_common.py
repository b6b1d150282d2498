"""What several benchmarks share: the real corpus sample they read (`python bench/X.py` puts this folder on sys.path)."""

import gzip
import json
import os

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "corpus", "sentences.jsonl.gz")


def read_texts(path: str, n: int, min_chars: int = 1, max_chars: int | None = None) -> list[str]:
    """The first n texts of a JSONL(.gz) corpus whose stripped length is within [min_chars, max_chars]."""
    texts = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            t = json.loads(line).get("text", "").strip()
            if min_chars <= len(t) and (max_chars is None or len(t) <= max_chars):
                texts.append(t)
            if len(texts) == n:
                break
    return texts
