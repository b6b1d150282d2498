"""Corpus ingestion (`cqg-ray prepare`): files in, one clean, deduplicated Parquet corpus out.

Readers (``read``): ``list_files`` expands paths, ``parse_file(data, fmt, ...)`` turns the bytes of one file into
rows and a tally of what was dropped and why (empty texts, invalid UTF-8, broken JSON lines with their line
numbers), and ``rows_table`` gives them ids. Cleaning (``clean``): ``clean_text`` and ``text_hash`` are the
per-text rules, ``dedup_table`` drops repeated texts. The stage (``stage``): ``prepare`` reads every file in a Ray
Data pass (one task per file, each writing its rows to a part file), then deduplicates, samples and writes the
corpus in shards sorted by document id (in one task for small parts, in Ray Data passes past them), so that the
result does not depend on how the work was split (read back through ``cqg_ray.artifacts``).

Output (``<run>/prepare/``): ``part-*.parquet`` with columns doc_id, text, source, line; ``stats.json``.
Document ids: the id column when one is named, else the first 16 hex digits of sha1(text) (with ``corpus.dedup`` off:
of the file, the line and the text's hash), stable across runs and machines.
"""

from cqg_ray.corpus.clean import clean_text, dedup_table, sample_key, text_hash
from cqg_ray.corpus.read import CorpusError, detect_format, list_files, parse_file, read_bytes, rows_table
from cqg_ray.corpus.stage import prepare, repeated_id_rows, row_places, unwrap_error

__all__ = ["CorpusError", "clean_text", "dedup_table", "detect_format", "list_files",
           "parse_file", "prepare", "read_bytes", "repeated_id_rows", "row_places", "rows_table", "sample_key", "text_hash", "unwrap_error"]
