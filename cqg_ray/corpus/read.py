"""Corpus readers: paths to files (any filesystem, globs, folders), and one file's bytes to texts, ids and lines.

Formats: jsonl, parquet, csv, tsv, txt (each optionally .gz), and MEDI2's jsonl (positive and negative texts,
instructions stripped).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import logging
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cqg_ray.config import CorpusConfig
from cqg_ray.corpus.clean import clean_text, text_hash
from cqg_ray.textfiles import plain_name, tsv_quoted
from cqg_ray.texts import unicode_error
from cqg_ray.rundir import resolve

log = logging.getLogger("cqg_ray")
MAX_REPORTED_ERRORS = 20
# what ParseResult.dropped counts that is not a row dropped, and its name in a manifest's counts
KEPT_COUNTS = {"utf8_replaced": "replaced_invalid_utf8", "tsv_quoted": "tsv_files_read_quoted"}
TSV_QUOTED_NOTE = ("TSV file(s) read with CSV quoting: written so (a quoted field with its quotes doubled inside, or rows "
                   "that only quoting makes whole), as pandas' to_csv(sep='\\t') writes")
SURROGATE = re.compile("[\ud800-\udfff]")  # a code point that a str may hold (JSON's "\ud800" escape) but UTF-8 cannot
# CSV fields as long as a text may be (the csv module's default limit is 131,072 characters)
csv.field_size_limit(2**31 - 1)


def replaced_utf8_warning(stage: str, n: int) -> str:
    """The warning a stage logs for rows whose bytes were not UTF-8 (or whose JSON strings held unpaired surrogates) and
    were kept with U+FFFD in their place."""
    return (f"{stage}: {n} row(s) held bytes that are not UTF-8, replaced by U+FFFD (maybe another encoding, or binary; "
            "corpus.invalid_utf8: reject drops such rows)")


class CorpusError(ValueError):
    """A corpus that cannot be read as configured (missing column, unknown format, no files)."""


def known_format(path: str) -> bool:
    try:
        detect_format(path)
        return True
    except CorpusError:
        return False


def detect_format(path: str) -> str:
    name = plain_name(path)
    for ext, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".ndjson", "jsonl"), (".parquet", "parquet"),
                     (".csv", "csv"), (".tsv", "tsv"), (".txt", "txt")):
        if name.endswith(ext):
            return fmt
    raise CorpusError(f"cannot tell the format of {path}: name it .jsonl/.parquet/.csv/.tsv/.txt (optionally .gz) or set corpus.format")


@dataclass
class ParseResult:
    texts: list[str] = field(default_factory=list)
    ids: list[str | None] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # first few problems, with line numbers

    def error(self, kind: str, msg: str) -> None:
        self.dropped[kind] += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(msg)


def _json_lines(lines, source: str, res: ParseResult):
    """Yield (line_number, parsed value) for each JSON line; empty lines and invalid JSON counted in ``res``."""
    for i, line in lines:
        if not line.strip():
            res.dropped["empty"] += 1
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            res.error("bad_json", f"{source}:{i}: invalid JSON ({e.msg} at column {e.colno})")


def _decode_lines(data: bytes, source: str, invalid_utf8: str, res: ParseResult):
    """Yield (line_number, str) for each line; invalid UTF-8 replaced or the line rejected, and counted."""
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the newline that ends the last line does not start another
    for i, raw in enumerate(pieces, start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            yield i, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if invalid_utf8 == "reject":
                res.error("invalid_utf8", f"{source}:{i}: invalid UTF-8 ({e.reason} at byte {e.start}); line rejected")
                continue
            res.dropped["utf8_replaced"] += 1  # kept, not dropped; counted for the report
            yield i, raw.decode("utf-8", errors="replace")


def _medi2_texts(obj: Any) -> list[str]:
    """Positive and negative texts of one MEDI2 line, instruction parts stripped.

    MEDI2 items are ``[instruction, text]`` pairs (or bare strings); ``pos`` and ``neg`` hold lists of them.
    """
    out = []
    for key in ("pos", "neg"):
        items = obj.get(key) or []
        if isinstance(items, (str, dict)) or (isinstance(items, list) and len(items) == 2 and all(isinstance(x, str) for x in items)):
            items = [items]
        for item in items:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, list) and item:
                out.append(item[-1] if isinstance(item[-1], str) else "")
            elif isinstance(item, dict):
                out.append(item.get("text", ""))
    return out


def parse_file(data: bytes, fmt: str, source: str, cfg: CorpusConfig) -> ParseResult:
    """Parse the (decompressed) bytes of one corpus file into texts, ids and line numbers."""
    res = ParseResult()

    def add(text: Any, doc_id: Any, line: int) -> None:
        if text is not None and not isinstance(text, str):
            res.error("not_text", f"{source}:{line}: {cfg.text_column!r} is not a string (a JSON or Arrow {type(text).__name__}); row rejected")
            return
        fields = ((text, repr(cfg.text_column)), (doc_id, f"the id {cfg.id_column!r}"))
        if problem := next((p for v, name in fields if isinstance(v, str) and (p := unicode_error(v, name))), None):
            if cfg.invalid_utf8 == "reject":  # not UTF-8 either: the rule for invalid bytes, a row at a time
                res.error("invalid_utf8", f"{source}:{line}: {problem}; row rejected")
                return
            res.dropped["utf8_replaced"] += 1  # kept, not dropped; counted for the report
            text, doc_id = (SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v for v, _ in fields)
        t = clean_text(text, cfg.min_chars, cfg.max_chars)
        if t is None:
            res.dropped["empty"] += 1
            return
        if cfg.id_column and (doc_id is None or str(doc_id).strip() == ""):  # an id column promises an id a row
            res.error("missing_id", f"{source}:{line}: no {cfg.id_column!r} id (null or empty); row rejected")
            return
        res.texts.append(t)
        res.ids.append(None if doc_id is None else str(doc_id))
        res.lines.append(line)

    if fmt == "parquet":
        try:
            table = pq.read_table(io.BytesIO(data))
        except (pa.ArrowException, OSError) as e:  # truncated, not Parquet at all, a corrupt footer
            raise CorpusError(f"{source}: not a readable Parquet file ({e})") from None
        if cfg.text_column not in table.column_names:
            raise CorpusError(f"{source}: no column {cfg.text_column!r} (columns: {', '.join(table.column_names)})")
        if cfg.id_column and cfg.id_column not in table.column_names:
            raise CorpusError(f"{source}: no id column {cfg.id_column!r} (columns: {', '.join(table.column_names)})")
        texts = table.column(cfg.text_column).to_pylist()
        ids = table.column(cfg.id_column).to_pylist() if cfg.id_column else [None] * len(texts)
        for i, (t, d) in enumerate(zip(texts, ids), start=1):
            add(t, d, i)
        return res

    if fmt in ("jsonl", "medi2"):
        missing_col = 0
        items = None
        if data[:4096].lstrip()[:1] == b"[":  # a .json file holding one array of objects: its items are the rows (numbered from 1)
            try:
                items = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                items = None  # JSON Lines whose first line is an array: read by line below
        if isinstance(items, list):
            records = enumerate(items, start=1)
        else:
            records = _json_lines(_decode_lines(data, source, cfg.invalid_utf8, res), source, res)
        for i, obj in records:
            if not isinstance(obj, dict):
                res.error("bad_json", f"{source}:{i}: expected a JSON object, got {type(obj).__name__}")
                continue
            if fmt == "medi2":
                for t in _medi2_texts(obj):
                    add(t, None, i)
                continue
            if cfg.text_column not in obj:
                missing_col += 1
                res.error("missing_column", f"{source}:{i}: no field {cfg.text_column!r} (fields: {', '.join(list(obj)[:10])})")
                continue
            add(obj[cfg.text_column], obj.get(cfg.id_column) if cfg.id_column else None, i)
        if missing_col and not res.texts:
            raise CorpusError(f"{source}: no line has the text field {cfg.text_column!r}; first problem: {res.errors[0] if res.errors else ''}")
        if cfg.id_column and res.dropped["missing_id"] and not res.texts:
            raise CorpusError(f"{source}: no line has the id field {cfg.id_column!r}; first problem: {res.errors[0] if res.errors else ''}")
        return res

    if fmt == "txt":
        if cfg.id_column:  # every line would be rejected for its missing id
            raise CorpusError(f"{source}: a .txt file holds one text a line and no ids: unset corpus.id_column "
                              f"({cfg.id_column!r}), or give the ids in a jsonl, csv or parquet file")
        for i, line in _decode_lines(data, source, cfg.invalid_utf8, res):
            add(line, None, i)
        return res

    if fmt in ("csv", "tsv"):
        text = "\n".join(line for _, line in _decode_lines(data, source, cfg.invalid_utf8, res))
        quoted = fmt == "csv" or tsv_quoted(text)
        if fmt == "tsv" and quoted:
            res.dropped["tsv_quoted"] += 1  # a file, not a row; counted for the report
        delimiter = "\t" if fmt == "tsv" else ","
        reader = csv.DictReader(io.StringIO(text), delimiter=delimiter,
                                quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
        if reader.fieldnames is None or cfg.text_column not in reader.fieldnames:
            raise CorpusError(f"{source}: no column {cfg.text_column!r} (columns: {', '.join(reader.fieldnames or [])})")
        if cfg.id_column and cfg.id_column not in reader.fieldnames:
            raise CorpusError(f"{source}: no id column {cfg.id_column!r} (columns: {', '.join(reader.fieldnames)})")
        width = len(reader.fieldnames)
        start = last_start = reader.line_num + 1  # the line each row starts on, and the last row's
        try:
            for row in reader:
                last_start, start = start, reader.line_num + 1
                if None in row or None in row.values():  # more fields than the header (restkey None), or fewer (restval None)
                    n = width + len(row.get(None) or []) - sum(v is None for k, v in row.items() if k is not None)
                    res.error("ragged", f"{source}:{reader.line_num}: {n} field(s) where the header has {width}; row rejected")
                    continue
                add(row.get(cfg.text_column), row.get(cfg.id_column) if cfg.id_column else None, reader.line_num)
        except csv.Error as e:
            raise CorpusError(f"{source}:{reader.line_num}: not readable as {fmt.upper()} ({e})") from None
        if quoted and reader.line_num > last_start and quote_left_open(text, last_start, delimiter):
            raise CorpusError(f"{source}:{last_start}: a quoted field of this row is never closed, so lines {last_start}-"
                              f"{reader.line_num} (the rest of the file) read as one row; close the quote, or double a quote "
                              'inside a quoted field ("")')
        return res

    raise CorpusError(f"unknown corpus format {fmt!r}")


def quote_left_open(text: str, line: int, delimiter: str) -> bool:
    """Whether the rows of ``text`` from ``line`` (1-based) on end inside a quoted field: the lenient csv reader then
    reads every later line into that field, without a word."""
    tail = io.StringIO("\n".join(text.split("\n")[line - 1:]))
    try:
        for _ in csv.reader(tail, delimiter=delimiter, strict=True):
            pass
    except csv.Error as e:
        return "unexpected end of data" in str(e)
    return False


def rows_table(res: ParseResult, source: str, dedup: bool) -> pa.Table:
    """Arrow rows of one parsed file: doc_id, text, source, line, text_hash."""
    hashes = [text_hash(t) for t in res.texts]
    if any(i is not None for i in res.ids):
        ids = [i if i is not None else h for i, h in zip(res.ids, hashes)]
    elif dedup:
        ids = hashes
    else:  # duplicates are kept, so the id must tell them apart: hash of (source, line, text)
        ids = [hashlib.sha1(f"{source}:{ln}:{h}".encode()).hexdigest()[:16] for ln, h in zip(res.lines, hashes)]
    return pa.table({
        "doc_id": pa.array(ids, pa.string()),
        "text": pa.array(res.texts, pa.string()),
        "source": pa.array([source] * len(ids), pa.string()),
        "line": pa.array(res.lines, pa.int64()),
        "text_hash": pa.array(hashes, pa.string()),
    })


def hidden_below(folder: str, path: str) -> bool:
    """Whether ``path`` (a file found under ``folder``) is named .* or _*, or lies in a folder so named below ``folder``
    (hidden, or metadata as Spark's _SUCCESS and _temporary/, or an embed output's _corpus/)."""
    return any(part.startswith((".", "_")) for part in path[len(folder.rstrip("/")) + 1:].split("/"))


def glob_pattern(path: str) -> re.Pattern:
    """A glob as the shell reads it: ``*``, ``?`` and ``[...]`` within one folder's names, ``**/`` any folders below."""
    out, i = [], 0
    while i < len(path):
        if path.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif path.startswith("**", i):
            out.append(".*")
            i += 2
        elif path[i] == "*":
            out.append("[^/]*")
            i += 1
        elif path[i] == "?":
            out.append("[^/]")
            i += 1
        elif path[i] == "[" and (end := path.find("]", i + 2)) != -1:
            body = path[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(path[i]))
            i += 1
    return re.compile("".join(out))


def list_files(paths: list[str], fmt: str) -> list[tuple[str, str]]:
    """Expand files, folders and globs (``glob_pattern``) to a list of (uri, format): each path's files sorted, a file once;
    a folder's or glob's files named .* or _* (or in a folder so named below it) left out."""
    if not paths:
        raise CorpusError("corpus.paths is empty: give at least one file or folder")
    out: list[tuple[str, str]] = []
    skipped: list[str] = []  # files of a folder or glob that are no corpus format (a README.md, a LICENSE): left out, said
    hidden: list[str] = []  # a folder's files named .* or _* (hidden, or metadata as _SUCCESS): left out, said where of a corpus format
    for p in paths:
        fs, path = resolve(p)
        prefix = p.split("://")[0] + "://" if "://" in p else ""
        if any(c in path for c in "*?["):
            base = path[: min(path.find(c) for c in "*?[" if c in path)].rsplit("/", 1)[0] or "/"
            infos = fs.get_file_info(pafs.FileSelector(base, recursive="/" in path[len(base) + 1:], allow_not_found=True))
            pattern = glob_pattern(path)
            files = sorted(i.path for i in infos if i.type == pafs.FileType.File and pattern.fullmatch(i.path))
            matched = [f for f in files if not hidden_below(base, f)]
            hidden += [f for f in files if hidden_below(base, f) and (fmt != "auto" or known_format(f))]
            if not matched and len(paths) > 1:  # a typo in one of several paths is not left out silently
                raise CorpusError(f"corpus glob {p} matches no file")
        else:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                where = "" if "://" in p or os.path.isabs(p) else f" (a relative path, read from {os.getcwd()}, where the command runs)"
                raise CorpusError(f"corpus path not found: {p}{where}")
            if info.type == pafs.FileType.Directory:
                files = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File)
                matched = [f for f in files if not hidden_below(path, f)]
                hidden += [f for f in files if hidden_below(path, f) and (fmt != "auto" or known_format(f))]
            else:
                matched = [path]
        listed = matched != [path]  # found in a folder or by a glob, not named
        for m in matched:
            base = os.path.basename(m)
            if fmt == "auto" and listed and not known_format(m):
                skipped.append(m)
                continue
            if fmt == "medi2":
                if base.startswith("task"):  # paper, Appendix D: files starting with `task` are not corpus material
                    continue
                out.append((prefix + m if prefix and not m.startswith(prefix) else m, "medi2"))
            else:
                out.append((prefix + m if prefix and not m.startswith(prefix) else m, detect_format(m) if fmt == "auto" else fmt))
    if skipped:
        log.warning("corpus: %d file(s) of no corpus format left out (%s%s): name them .jsonl/.parquet/.csv/.tsv/.txt to read "
                    "them, or set corpus.format", len(skipped), ", ".join(os.path.basename(m) for m in skipped[:3]),
                    ", ..." if len(skipped) > 3 else "")
    if hidden:
        log.warning("corpus: %d file(s) named .* or _* (or in such a folder) in a folder or glob left out as hidden or metadata files (%s%s): rename them, or "
                    "name them as paths, to read them", len(hidden), ", ".join(os.path.basename(m) for m in hidden[:3]),
                    ", ..." if len(hidden) > 3 else "")
    if not out:
        raise CorpusError(f"no corpus files found under {', '.join(paths)}"
                          + (f" ({len(skipped)} file(s) of no corpus format: {', '.join(os.path.basename(m) for m in skipped[:3])})" if skipped else ""))
    return list(dict.fromkeys(out))  # a file that two paths name (a folder and a glob in it, say) is read once


def read_bytes(uri: str) -> bytes:
    fs, path = resolve(uri)
    try:
        with fs.open_input_stream(path, compression=None) as f:
            data = f.read()
    except FileNotFoundError:
        raise CorpusError(f"corpus file not found: {uri}") from None
    if uri.endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise CorpusError(f"{uri}: corrupt gzip file ({e})") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 with its byte order mark (Windows' "Unicode" text files)
        try:
            return data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{uri}: starts as UTF-16 but is not ({e.reason} at byte {e.start})") from None
    return data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is not part of the first line
