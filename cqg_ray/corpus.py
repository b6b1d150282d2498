"""Corpus ingestion (`cqg-ray prepare`): files in, one clean, deduplicated Parquet corpus out.

Pure core: ``parse_file(data, fmt, ...)`` turns the bytes of one file into rows and a tally of what was
dropped and why (empty texts, invalid UTF-8, broken JSON lines with their line numbers);
``clean_text`` and ``text_hash`` are the per-text rules. Ray layer: ``prepare`` reads every file in a
Ray Data pass (one task per file, each writing its rows to a part file), then deduplicates, samples and
writes the corpus in shards sorted by document id, so that the result does not depend on how the
work was split.

Output (``<run>/prepare/``): ``part-*.parquet`` with columns doc_id, text, source, line; ``stats.json``.
Document ids: the id column when one is named, else the first 16 hex digits of sha1(text) (stable
across runs and machines).
"""

from __future__ import annotations

import csv
import fnmatch
import gzip
import hashlib
import io
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cqg_ray.config import CorpusConfig
from cqg_ray.rundir import RunDir, StageContext, resolve

log = logging.getLogger("cqg_ray")

CORPUS_SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("line", pa.int64())])
MAX_REPORTED_ERRORS = 20


class CorpusError(ValueError):
    """A corpus that cannot be read as configured (missing column, unknown format, no files)."""


# ----------------------------------------------------------------------------------------- pure core


def text_hash(text: str) -> str:
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


def detect_format(path: str) -> str:
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
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
        t = clean_text(text, cfg.min_chars, cfg.max_chars)
        if t is None:
            res.dropped["empty"] += 1
            return
        res.texts.append(t)
        res.ids.append(None if doc_id is None else str(doc_id))
        res.lines.append(line)

    if fmt == "parquet":
        table = pq.read_table(io.BytesIO(data))
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
        for i, line in _decode_lines(data, source, cfg.invalid_utf8, res):
            if not line.strip():
                res.dropped["empty"] += 1
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                res.error("bad_json", f"{source}:{i}: invalid JSON ({e.msg} at column {e.colno})")
                continue
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
        return res

    if fmt == "txt":
        for i, line in _decode_lines(data, source, cfg.invalid_utf8, res):
            add(line, None, i)
        return res

    if fmt in ("csv", "tsv"):
        good = []
        for i, line in _decode_lines(data, source, cfg.invalid_utf8, res):
            good.append(line)
        reader = csv.DictReader(io.StringIO("\n".join(good)), delimiter="\t" if fmt == "tsv" else ",",
                                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
        if reader.fieldnames is None or cfg.text_column not in reader.fieldnames:
            raise CorpusError(f"{source}: no column {cfg.text_column!r} (columns: {', '.join(reader.fieldnames or [])})")
        if cfg.id_column and cfg.id_column not in reader.fieldnames:
            raise CorpusError(f"{source}: no id column {cfg.id_column!r} (columns: {', '.join(reader.fieldnames)})")
        for row in reader:
            add(row.get(cfg.text_column), row.get(cfg.id_column) if cfg.id_column else None, reader.line_num)
        return res

    raise CorpusError(f"unknown corpus format {fmt!r}")


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


def dedup_table(table: pa.Table) -> tuple[pa.Table, int]:
    """Keep the first occurrence (by source, line) of each text hash. Returns (table, duplicates dropped)."""
    if table.num_rows == 0:
        return table, 0
    order = table.sort_by([("text_hash", "ascending"), ("source", "ascending"), ("line", "ascending")])
    h = order.column("text_hash").to_numpy(zero_copy_only=False)
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = h[1:] != h[:-1]
    return order.filter(pa.array(keep)), int((~keep).sum())


# ----------------------------------------------------------------------------------------- files


def list_files(paths: list[str], fmt: str) -> list[tuple[str, str]]:
    """Expand files, folders and globs to a sorted list of (uri, format)."""
    if not paths:
        raise CorpusError("corpus.paths is empty: give at least one file or folder")
    out: list[tuple[str, str]] = []
    for p in paths:
        fs, path = resolve(p)
        prefix = p.split("://")[0] + "://" if "://" in p else ""
        if any(c in path for c in "*?["):
            base = path[: min(path.find(c) for c in "*?[" if c in path)].rsplit("/", 1)[0] or "/"
            infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
            matched = sorted(i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, path))
        else:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise CorpusError(f"corpus path not found: {p}")
            if info.type == pafs.FileType.Directory:
                infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
                matched = sorted(i.path for i in infos if i.type == pafs.FileType.File and not os.path.basename(i.path).startswith((".", "_")))
            else:
                matched = [path]
        for m in matched:
            base = os.path.basename(m)
            if fmt == "medi2":
                if base.startswith("task"):  # paper, Appendix E: files starting with `task` are not corpus material
                    continue
                out.append((prefix + m if prefix and not m.startswith(prefix) else m, "medi2"))
            else:
                out.append((prefix + m if prefix and not m.startswith(prefix) else m, detect_format(m) if fmt == "auto" else fmt))
    if not out:
        raise CorpusError(f"no corpus files found under {paths}")
    return out


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
        except (OSError, EOFError) as e:
            raise CorpusError(f"{uri}: corrupt gzip file ({e})") from None
    return data


# ----------------------------------------------------------------------------------------- Ray layer


def unwrap_error(err: BaseException, kind: type[BaseException]) -> BaseException:
    """The first ``kind`` error in a chain of Ray wrappers (or the error itself)."""
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = getattr(e, "cause", None) or e.__cause__
    text = str(err)
    marker = f"{kind.__module__}.{kind.__name__}: "
    if marker in text:
        return kind(text.split(marker, 1)[1].split("\n", 1)[0])
    return err


def _parse_one(row: dict, cfg_json: str, parts_uri: str) -> dict:
    """Ray Data map: parse one file, write its rows to a part file, return the tally."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    uri, fmt, idx = row["uri"], row["format"], int(row["index"])
    res = parse_file(read_bytes(uri), fmt, uri, cfg)
    table = rows_table(res, uri, cfg.dedup)
    run = RunDir(parts_uri)
    run.write_table(f"part-{idx:06d}.parquet", table)
    return {"uri": uri, "rows": table.num_rows, "dropped": json.dumps(dict(res.dropped)), "errors": json.dumps(res.errors)}


def _keep_sampled(batch: pa.Table, seed: int, cut: float) -> pa.Table:
    keys = np.array([sample_key(d, seed) for d in batch.column("doc_id").to_pylist()])
    return batch.filter(pa.array(keys <= cut))


def _dedup_bucket(batch: pa.Table) -> pa.Table:
    table, _ = dedup_table(batch)
    return table


def prepare(cfg: CorpusConfig, ctx: StageContext) -> None:
    """Read, clean, dedup, sample and write the corpus under ``ctx.uri``."""
    import ray

    files = list_files(cfg.paths, cfg.format)
    log.info("prepare: %d file(s)", len(files))
    run = ctx.run
    parts_rel = f"{ctx.stage}/_parts"
    run.makedirs(parts_rel)
    items = [{"uri": u, "format": f, "index": i} for i, (u, f) in enumerate(files)]
    cfg_json = cfg.model_dump_json()
    parts_uri = run.uri(parts_rel)
    try:
        tallies = ray.data.from_items(items).map(_parse_one, fn_kwargs={"cfg_json": cfg_json, "parts_uri": parts_uri}).take_all()
    except Exception as e:  # a CorpusError inside a Ray task arrives wrapped; give the user the plain message
        raise unwrap_error(e, CorpusError) from None

    dropped: Counter = Counter()
    errors: list[str] = []
    for t in tallies:
        dropped.update(json.loads(t["dropped"]))
        errors.extend(json.loads(t["errors"]))
    for e in errors[:MAX_REPORTED_ERRORS]:
        log.warning("prepare: %s", e)
    read_rows = sum(t["rows"] for t in tallies)

    ds = ray.data.read_parquet(parts_uri, filesystem=run.fs if not run.local else None)
    n_dups = 0
    if cfg.dedup and read_rows:
        # Exact dedup at scale: hash-partition by text hash, dedup inside each group.
        ds = ds.add_column("bucket", lambda b: __import__("pyarrow.compute").compute.utf8_slice_codeunits(b["text_hash"], 0, 2), batch_format="pyarrow")
        ds = ds.groupby("bucket", num_partitions=max(1, min(256, read_rows // 50_000))).map_groups(_dedup_bucket, batch_format="pyarrow").drop_columns(["bucket"])
    ds = ds.drop_columns(["text_hash"]).materialize()
    n_docs = ds.count() if read_rows else 0
    if cfg.dedup:
        n_dups = read_rows - n_docs
    if n_docs == 0:
        raise CorpusError(f"the corpus is empty after cleaning ({dict(dropped)}); nothing to do")
    # ids must be unique (an id column with repeats is a data error worth stopping for); only the id column
    # travels to the driver (~20 bytes a document).
    ids = np.sort(np.concatenate([b["doc_id"].to_numpy(zero_copy_only=False) for b in
                                  ds.select_columns(["doc_id"]).iter_batches(batch_format="pyarrow", batch_size=None)]))
    if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
        dup = ids[1:][ids[1:] == ids[:-1]][0]
        raise CorpusError(f"document id {dup!r} appears more than once (check corpus.id_column)")
    if cfg.limit is not None and n_docs > cfg.limit:
        # order-independent seeded sample: keep the `limit` documents with the smallest sample keys
        keys = np.array([sample_key(d, cfg.sample_seed) for d in ids])
        cut = np.partition(keys, cfg.limit - 1)[cfg.limit - 1]
        seed = cfg.sample_seed
        ds = ds.map_batches(_keep_sampled, fn_kwargs={"seed": seed, "cut": cut}, batch_format="pyarrow")
    # Shards sorted by doc_id: the corpus does not depend on how the reading was split.
    ds = ds.sort("doc_id")
    for name in run.ls(ctx.stage, suffix=".parquet"):
        run.rm(ctx.stage, name)
    ds.write_parquet(ctx.uri, filesystem=None if run.local else run.fs, min_rows_per_file=cfg.rows_per_shard,
                     max_rows_per_file=cfg.rows_per_shard, filename_provider=_ShardNames())
    n_out = sum(pq.ParquetFile(run.path(ctx.stage, n), filesystem=run.fs).metadata.num_rows for n in run.ls(ctx.stage, suffix=".parquet"))
    n_before_limit, table_rows = n_docs, n_out
    run.rm(parts_rel)
    ctx.counts.update({
        "files": len(files), "read_rows": read_rows, "duplicates": n_dups, "sampled_out": n_before_limit - table_rows,
        "documents": table_rows, **{(f"dropped_{k}" if k != "utf8_replaced" else "replaced_invalid_utf8"): v for k, v in dropped.items()},
    })
    run.write_json(f"{ctx.stage}/stats.json", {**ctx.counts, "errors": errors[:MAX_REPORTED_ERRORS]})


class _ShardNames:
    """Shard file names ``part-<write>-<task>.parquet`` (Ray Data FilenameProvider protocol)."""

    def __new__(cls):
        from ray.data.datasource import FilenameProvider

        class ShardNames(FilenameProvider):
            def get_filename_for_task(self, write_uuid, task_index):
                return f"part-{task_index:06d}-{write_uuid}.parquet"

            def get_filename_for_block(self, block, write_uuid, task_index, block_index):
                return f"part-{task_index:06d}-{block_index:04d}-{write_uuid}.parquet"

        return ShardNames()


def write_corpus(run: RunDir, stage: str, table: pa.Table, rows_per_shard: int) -> int:
    n = max(1, -(-table.num_rows // rows_per_shard))
    for i in range(n):
        run.write_table(f"{stage}/part-{i:05d}.parquet", table.slice(i * rows_per_shard, rows_per_shard))
    return n


def corpus_shards(run: RunDir) -> list[str]:
    """Paths (inside run.fs) of the corpus shards, in order."""
    run.require("prepare")
    return [run.path("prepare", n) for n in run.ls("prepare", suffix=".parquet")]


def load_corpus(run: RunDir, columns: list[str] | None = None) -> pa.Table:
    """The whole prepared corpus (sorted by doc_id). For stages that need texts of chosen documents."""
    run.require("prepare")
    cols = None if columns is None else list(dict.fromkeys(["doc_id", *columns]))
    table = run.read_table("prepare", columns=cols).sort_by("doc_id")
    return table if columns is None else table.select(columns)
