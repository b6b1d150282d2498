"""Reading files of texts, for the commands that take one (`cqg-ray evaluate`'s data, `cqg-ray budget --stats`): local
paths or any pyarrow/fsspec URI, gzip by its magic bytes, UTF-8, JSONL and TSV, with errors that name the file and line.

    load_texts("texts.jsonl.gz").texts     # the text field of each object, blank and repeated texts dropped
    read_tsv_rows("pairs.tsv")             # (line, fields) of each row: plain tabs as STS's files, or CSV quoting where written so
    sample_indices(n, k, seed)             # a seeded sample that keeps the file order
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from cqg_ray.rundir import resolve


class DataError(ValueError):
    """A file of texts or evaluation data that cannot be read: missing file, wrong columns, broken line (with its location)."""


def plain_name(uri: str) -> str:
    """The file's name in lower case without a trailing ``.gz``: the suffix that says what it holds."""
    name = uri.lower()
    return name[:-3] if name.endswith(".gz") else name


def read_bytes(uri: str) -> bytes:
    """Bytes of a local path or any pyarrow/fsspec URI; gzip content (by its magic bytes) is decompressed."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise DataError(f"file not found: {uri}")
    if info.type != pafs.FileType.File:
        raise DataError(f"not a file: {uri}")
    with fs.open_input_stream(path, compression=None) as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DataError(f"{uri}: broken gzip file: {e}") from None
    return data


def read_text_lines(uri: str) -> list[str]:
    try:
        text = read_bytes(uri).decode("utf-8-sig")  # a byte-order mark (Excel's, Notepad's "UTF-8") is not the header's text
    except UnicodeDecodeError as e:
        raise DataError(f"{uri} is not UTF-8: {e}") from None
    return text.splitlines()


# a field as CSV quoting writes one that holds a quote: wrapped in quotes, each quote inside doubled
QUOTED_FIELD = re.compile(r'"(?:[^"]|"")*""(?:[^"]|"")*"', re.S)


def tsv_quoted(text: str) -> bool:
    """Whether a TSV's text was written with CSV quoting (pandas' ``to_csv(sep="\\t")``, Python's csv module), so that it
    is read with quoting rather than as plain tab-separated fields (STS's files, where a ``"`` is text). Yes where, read
    plainly, a field is wrapped in quotes with a doubled quote inside or rows break (a quoted field that holds a newline
    or a tab), and read with quoting, the text parses strictly into fewer broken rows. A text without ``"`` is plain."""
    if '"' not in text:
        return False
    broken, escaped = _row_shape(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE), escapes=True)
    if not broken and not escaped:
        return False
    try:
        broken_quoted, _ = _row_shape(csv.reader(io.StringIO(text), delimiter="\t", strict=True))
    except csv.Error:
        return False
    return broken_quoted < broken or (broken_quoted == 0 and escaped)


def _row_shape(rows, escapes: bool = False) -> tuple[int, bool]:
    """(the rows whose field count differs from the first non-empty row's, and with ``escapes`` whether a field reads
    as QUOTED_FIELD), counted as the rows stream: no row is held, as the whole file's would be."""
    width, broken, escaped = None, 0, False
    for row in rows:
        if row:
            width = len(row) if width is None else width
            broken += len(row) != width
            escaped = escaped or (escapes and any(QUOTED_FIELD.fullmatch(f) for f in row))
    return broken, escaped


def read_tsv_rows(uri: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank row of a TSV: plain tab-separated fields, or with CSV quoting where the
    file was written so (`tsv_quoted`; a row then ends on the line its last field ends)."""
    lines = read_text_lines(uri)
    text = "\n".join(lines)
    if not tsv_quoted(text):
        return [(i, line.split("\t")) for i, line in enumerate(lines, start=1) if line.strip()]
    reader = csv.reader(io.StringIO(text), delimiter="\t", strict=True)
    return [(reader.line_num, row) for row in reader if any(f.strip() for f in row)]


def read_jsonl(uri: str) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(read_text_lines(uri), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{uri}:{i}: broken JSON line: {e}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{uri}:{i}: expected a JSON object, got {type(obj).__name__}")
        rows.append(obj)
    return rows


def sample_indices(n: int, k: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded random sample of k out of n (all of them when k is None or >= n)."""
    if k is None or k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


_ALIASES = {"STSBenchmark": "STS-B", "scifact": "SciFact", "twentynewsgroups": "TNG"}


def dataset_name(uri: str) -> str:
    """Short column name for a dataset file or folder: STS12.test.tsv -> STS12, STSBenchmark.test.tsv -> STS-B."""
    base = os.path.basename(uri.rstrip("/"))
    for suffix in (".gz", ".jsonl", ".json", ".tsv", ".csv", ".test"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return _ALIASES.get(base, base)


@dataclass
class TextsData:
    name: str
    path: str
    texts: list[str]  # unique, non-empty, in file order

    def __len__(self) -> int:
        return len(self.texts)


def load_texts(uri: str, field: str = "text") -> TextsData:
    """Texts of a JSONL(.gz) file (``field`` of each object) or a TSV (a ``text`` column, or STS's ``sentence1`` and
    ``sentence2``: both sentences of every pair); blank texts and repeats are dropped, the file order is kept."""
    name = plain_name(uri)
    if name.endswith((".csv", ".txt", ".parquet")):  # read as JSON Lines, the first line was "broken JSON"
        raise DataError(f"{uri}: a file of texts here is JSONL (a {field!r} field a line, .jsonl or .json, optionally .gz) or "
                        f"a TSV (.tsv); not .{name.rsplit('.', 1)[1]}")
    if name.endswith(".tsv"):
        rows = read_tsv_rows(uri)
        if not rows:
            raise DataError(f"{uri}: empty file")
        head = rows[0][1]
        if field in head:
            cols = [head.index(field)]
        elif "sentence1" in head and "sentence2" in head:
            cols = [head.index("sentence1"), head.index("sentence2")]
        else:
            raise DataError(f"{uri}: a TSV of texts needs a header naming {field!r} (or sentence1 and sentence2); got {head}")
        raw = []
        for i, fields in rows[1:]:
            if len(fields) <= max(cols):
                raise DataError(f"{uri}:{i}: expected at least {max(cols) + 1} tab-separated fields, got {len(fields)}")
            raw += [fields[c] for c in cols]
    else:
        raw = []
        for i, row in enumerate(read_jsonl(uri), start=1):
            if not isinstance(row.get(field), str):
                raise DataError(f"{uri}: object {i} has no string field {field!r} (keys: {sorted(row)[:8]})")
            raw.append(row[field])
    texts = list(dict.fromkeys(t.strip() for t in raw if t.strip()))
    if not texts:
        raise DataError(f"{uri}: no texts")
    return TextsData(name=dataset_name(uri), path=uri, texts=texts)
