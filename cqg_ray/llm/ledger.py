"""The request ledger: every finished LLM call of a stage, in Parquet shards under the run directory.

    <run>/llm/ledger/<stage>/<time_ns>-<uid>.parquet    one shard per flush (key, text, ok, answers, tokens, ...)
    <run>/llm/ledger/<stage>/_journal.jsonl             each finished row, appended the moment it finishes
    <run>/llm/ledger/<stage>/_journal-<id>.jsonl        the same, one per worker when Ray workers write at once
    <run>/llm/ledger/<stage>/_stats.json                per-stage accounting (totals + one entry per run)

A request's key is a hash of (backend and model identity, chat messages, max_tokens, n_answers, logprobs);
its ``meta`` is not part of it. A shard is written atomically (temp file + rename on local disks, one PUT on
object stores), so a killed process leaves whole shards only; the same key in two shards (a compaction
killed midway) is harmless: the last one read wins.

Shards are large: a writer (``BatchWriter``) writes one every ``llm.flush_every`` rows (50,000) or ``llm.flush_s``
seconds (60), so a million answers make tens of objects, not tens of thousands. Between two shards, every finished
row is also appended to the writer's journal as one JSON line, written through to the operating system before the
next request is judged; the journal is emptied once its rows are in a shard. So a process killed at any moment
(SIGKILL included) loses only the requests in flight: readers read the shards and every journal (a torn last
line is ignored), and ``recover`` moves killed writers' journals into a shard. Object stores cannot append; there
the journal is off and a kill loses at most the rows since the last shard.

A resume reads the key column only (``columns``), not the results; a stage reads back the full rows of its own
keys only (``rows``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray.llm.base import Request
from cqg_ray.rundir import ArtifactError, RunDir

log = logging.getLogger("cqg_ray")

SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("text", pa.string()),
        ("ok", pa.bool_()),
        ("error", pa.string()),
        ("answers", pa.list_(pa.bool_())),
        ("p_yes", pa.list_(pa.float64())),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("attempts", pa.int32()),
        ("finished_at", pa.string()),
    ]
)
STATS = "_stats.json"
ACCOUNTING = ("key", "ok", "prompt_tokens", "completion_tokens", "attempts")  # the ledger columns a resume reads
JOURNAL = "_journal.jsonl"


def schema_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row with exactly the SCHEMA's fields (what a shard and a journal line hold)."""
    return {f.name: row.get(f.name) for f in SCHEMA}


def _fits_schema(rows: list[dict[str, Any]]) -> bool:
    """Whether every row converts to the ledger's schema (a journal line edited to other types does not)."""
    try:
        pa.Table.from_pylist(rows, schema=SCHEMA)
        return True
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False


def request_key(identity: dict[str, Any], req: Request, logprobs: bool = False) -> str:
    """sha256 of what decides a reply: model identity (backend, model, temperature, constrained), prompt, limits.
    ``stop_on_loop`` is not part of it: it cuts only a reply's loop, whose repeats the parse drops, so a reply kept
    from before it stands."""
    if not req.yes_no and "score_engine" in identity:  # the single-pass engine decides single-pass answers only
        identity = {k: v for k, v in identity.items() if k != "score_engine"}
    if (req.yes_no or req.n_answers is not None) and "generate_engine" in identity:  # the generation engine: generation requests only
        identity = {k: v for k, v in identity.items() if k != "generate_engine"}
    payload = {
        "model": identity,
        "messages": req.messages,
        "max_tokens": req.max_tokens,
        "n_answers": req.n_answers,
        "logprobs": bool(logprobs and req.n_answers is not None),
    }
    if req.yes_no:  # only where it applies, so packed and generation keys stay as they were
        payload["yes_no"] = True
        payload["answer_prefix"] = req.answer_prefix
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Ledger:
    """One stage's ledger. ``journal`` names this writer's journal: the runner's ``_journal.jsonl``, or one per
    worker (``worker_journal()``) when workers write at once; readers read every journal there is."""

    def __init__(self, run: RunDir, stage: str, journal: str = JOURNAL):
        if not stage or "/" in stage:
            raise ValueError(f"ledger stage must be a plain name, got {stage!r}")
        if not (journal.startswith("_journal") and journal.endswith(".jsonl")):
            raise ValueError(f"a journal is named _journal*.jsonl, got {journal!r}")
        self.run = run
        self.stage = stage
        self.folder = f"llm/ledger/{stage}"
        self.journal = journal
        self._journal: Any = None  # an open append stream while rows are journalled
        self.journal_supported = True

    def shards(self) -> list[str]:
        return self.run.ls(self.folder, suffix=".parquet")

    def read_shard(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """One shard's rows (``RunDir.read_table``: its page CRCs checked); one that cannot be read is an ArtifactError
        naming it, with what to do (moved aside, its requests are sent again)."""
        try:
            return self.run.read_table(f"{self.folder}/{name}", columns)
        except ArtifactError as e:
            raise ArtifactError(f"{e}; a corrupt LLM ledger shard: move it aside to send its requests again") from None

    def journals(self) -> list[str]:
        return [n for n in self.run.ls(self.folder, suffix=".jsonl") if n.startswith("_journal")]

    def columns(self, names: Sequence[str] = ("key",)) -> pa.Table:
        """These columns of every finished row (shards, then journals), nothing else read: a resume reads the keys
        only. A key may appear twice (a compaction or a recovery killed midway): the last one is the current row."""
        names = list(dict.fromkeys(["key", *names]))
        schema = pa.schema([SCHEMA.field(n) for n in names])
        parts = [self.read_shard(n, names).cast(schema) for n in self.shards()]
        journal = self.journal_rows()
        if journal:
            parts.append(pa.Table.from_pylist([{n: r.get(n) for n in names} for r in journal], schema=schema))
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def rows(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """key -> finished row for these keys only (the shards filtered as they are read, then the journals)."""
        wanted = pa.array(sorted(set(keys)), pa.string())
        out: dict[str, dict[str, Any]] = {}
        if len(wanted) == 0:
            return out
        for n in self.shards():
            t = self.read_shard(n)
            for row in t.filter(pc.is_in(t.column("key"), value_set=wanted)).to_pylist():
                out[row["key"]] = schema_row(row)
        keyset = set(wanted.to_pylist())
        for row in self.journal_rows():
            if row["key"] in keyset:
                out[row["key"]] = row
        return out

    def load(self) -> dict[str, dict[str, Any]]:
        """key -> finished row (dict with the SCHEMA's fields): every row of the shards, then the journals; {} for a
        new stage. For small ledgers and tests: stages read ``columns`` (resume) and ``rows`` (their own keys)."""
        rows: dict[str, dict[str, Any]] = {}
        if self.shards():
            rows = {row["key"]: schema_row(row) for row in self.run.read_table(self.folder).to_pylist()}
        for row in self.journal_rows():
            rows[row["key"]] = row
        return rows

    def journal_rows(self) -> list[dict[str, Any]]:
        """The rows journalled since the last shard, every journal's; a line torn by a kill (the last one) is skipped."""
        rows = []
        for name in self.journals():
            try:
                data = self.run.read_bytes(f"{self.folder}/{name}")
            except ArtifactError:  # removed between the listing and the read
                continue
            for line in data.split(b"\n"):
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # empty or torn
                if isinstance(row, dict) and isinstance(row.get("key"), str):
                    rows.append(schema_row(row))
        # a line of other types (edited) is skipped as a torn one; row by row only when the whole batch does not fit
        return rows if _fits_schema(rows) else [r for r in rows if _fits_schema([r])]

    def record(self, row: dict[str, Any]) -> None:
        """Journal one finished row now (one line, flushed to the OS): a kill after this cannot lose it."""
        if not self.journal_supported:
            return
        if self._journal is None:
            self.run.makedirs(self.folder)
            try:
                self._journal = self.run.fs.open_append_stream(self.run.path(self.folder, self.journal), compression=None)
            except (pa.ArrowNotImplementedError, NotImplementedError, OSError) as e:
                self.journal_supported = False
                log.info("ledger %s: no journal on this filesystem (%s); a kill loses at most the rows since the last shard", self.stage, e)
                return
        line = json.dumps(schema_row(row), ensure_ascii=False, separators=(",", ":"))
        self._journal.write(line.encode("utf-8") + b"\n")
        self._journal.flush()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def write_shard(self, rows: list[dict[str, Any]]) -> None:
        """One shard with these rows (atomic: temp file + rename, or one PUT)."""
        table = pa.Table.from_pylist([schema_row(r) for r in rows], schema=SCHEMA)
        self.run.write_table(f"{self.folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet", table)

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write one shard with these finished rows (no-op for none), then empty this writer's journal.

        Callers pass every row journalled since the last shard (and may pass more): the journal's rows are then
        all in a shard. A kill between the two steps leaves them in both, which is harmless.
        """
        if rows:
            self.write_shard(rows)
        self.close()
        self.run.rm(self.folder, self.journal)

    def recover(self) -> int:
        """Move the rows killed writers left in journals (every journal) into one shard; returns how many there were.
        Run it when no writer is running (at the start of a stage, or once its workers are done)."""
        names = self.journals()
        rows = self.journal_rows()
        if rows:
            self.write_shard(rows)
        self.close()
        for n in names:  # also removes a journal holding nothing readable
            self.run.rm(self.folder, n)
        return len(rows)

    def compact(self, min_shards: int = 64, small_rows: int = 10_000) -> int:
        """Merge the shards of fewer than ``small_rows`` rows into one when there are at least ``min_shards`` of them,
        streamed one shard at a time (never the ledger in memory); returns the shard count after. Large shards (the
        usual ``llm.flush_every``-row batches) are left as they are."""
        names = self.shards()
        small = [n for n in names if pq.ParquetFile(self.run.path(self.folder, n), filesystem=self.run.fs).metadata.num_rows < small_rows]
        if len(small) < min_shards:
            return len(names)
        # in name (time) order: the last copy of a key stays the last
        self.run.write_tables(f"{self.folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet", SCHEMA,
                              (self.read_shard(n) for n in small))
        for n in small:  # written first: a kill below leaves duplicates, never a loss
            self.run.rm(self.folder, n)
        return len(self.shards())

    def read_stats(self) -> dict[str, Any]:
        """The stage's accounting; started afresh (with a warning) when the file is torn or of another shape: it is
        accounting only, and never stops the stage."""
        fresh = {"stage": self.stage, "totals": {}, "runs": []}
        if not self.run.exists(self.folder, STATS):
            return fresh
        try:
            stats = self.run.read_json(f"{self.folder}/{STATS}")
        except ArtifactError as e:
            stats, why = None, str(e)
        else:
            why = "not an object with totals and runs"
        totals = stats.get("totals") if isinstance(stats, dict) else None
        if (isinstance(totals, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in totals.values())
                and isinstance(stats.get("runs"), list)):
            return stats
        log.warning("%s cannot be read (%s): the LLM accounting starts afresh", self.run.uri(self.folder, STATS), why)
        return fresh

    def write_stats(self, stats: dict[str, Any]) -> None:
        self.run.write_json(f"{self.folder}/{STATS}", stats)


def worker_journal() -> str:
    """A journal name of its own for one writer among several (a Ray worker)."""
    return f"_journal-{uuid.uuid4().hex[:12]}.jsonl"


class BatchWriter:
    """One writer's finished rows: each journalled the moment it finishes, and a shard written every ``flush_rows``
    rows or ``flush_s`` seconds (large shards: few objects per million answers). ``on_flush(rows)`` runs after
    each shard (the runner's accounting). What is not yet in a shard is in the journal: ``Ledger.recover`` moves it."""

    def __init__(self, ledger: Ledger, flush_rows: int, flush_s: float, on_flush: Callable[[list[dict[str, Any]]], None] | None = None):
        self.ledger, self.flush_rows, self.flush_s, self.on_flush = ledger, flush_rows, flush_s, on_flush
        self.buffer: list[dict[str, Any]] = []
        self.last = time.monotonic()
        self.shards = 0

    def add(self, row: dict[str, Any]) -> None:
        self.ledger.record(row)
        self.buffer.append(row)
        if len(self.buffer) >= self.flush_rows or time.monotonic() - self.last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        rows, self.buffer = self.buffer, []
        self.ledger.append(rows)
        self.shards += bool(rows)
        self.last = time.monotonic()
        if self.on_flush is not None:
            self.on_flush(rows)


def latest(table: pa.Table) -> pa.Table:
    """The last row of each key (``Ledger.columns`` may hold a key twice), in first-seen order of the kept rows."""
    if table.num_rows == 0:
        return table
    idx = table.append_column("_i", pa.array(np.arange(table.num_rows)))
    keep = idx.group_by("key", use_threads=False).aggregate([("_i", "max")]).column("_i_max").combine_chunks()
    return table.take(keep.sort())


def table_totals(table: pa.Table) -> dict[str, int]:
    """``totals`` over a table of ledger columns (key, ok, prompt_tokens, completion_tokens, attempts), last row per key."""
    return _row_sums(latest(table))


def _row_sums(t: pa.Table) -> dict[str, int]:
    """``totals`` over rows that are each a key's current row (ok, prompt_tokens, completion_tokens, attempts)."""
    if t.num_rows == 0:
        return {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "failures": 0, "retries": 0}
    attempts = pc.fill_null(t.column("attempts"), 1)
    return {
        "requests": t.num_rows,
        "prompt_tokens": int(pc.sum(pc.fill_null(t.column("prompt_tokens"), 0)).as_py() or 0),
        "completion_tokens": int(pc.sum(pc.fill_null(t.column("completion_tokens"), 0)).as_py() or 0),
        "failures": int(t.num_rows - (pc.sum(pc.fill_null(t.column("ok"), False).cast(pa.int64())).as_py() or 0)),
        "retries": int(pc.sum(pc.max_element_wise(pc.subtract(attempts.cast(pa.int64()), 1), 0)).as_py() or 0),
    }


def row_counts(row: dict[str, Any]) -> dict[str, int]:
    """One ledger row's share of the accounting."""
    return {
        "requests": 1,
        "prompt_tokens": int(row.get("prompt_tokens") or 0),
        "completion_tokens": int(row.get("completion_tokens") or 0),
        "failures": 0 if row.get("ok") else 1,
        "retries": max(0, int(row.get("attempts") or 1) - 1),
    }


def totals(rows: dict[str, dict[str, Any]] | list[dict[str, Any]]) -> dict[str, int]:
    """Accounting over ledger rows: requests, prompt/completion tokens, failures, retries."""
    t = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "failures": 0, "retries": 0}
    for r in rows.values() if isinstance(rows, dict) else rows:
        for k, v in row_counts(r).items():
            t[k] += v
    return t


# ----------------------------------------------------------------------------------------- the key index of streaming stages


@dataclass
class KeyIndex:
    """The ledger's keys, sorted, each with its row's place (shard name, row) and ok flag. A key (64 hex digits of a
    sha256) is held as its 32 bytes: the same order as the hex, half the memory."""

    keys: np.ndarray  # (n,) S32
    ok: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    shards: list[str]

    @classmethod
    def build(cls, ledger: Ledger) -> "KeyIndex":
        """From the shards' key and ok columns only (journals must be recovered first). The last copy of a key wins.

        One shard is read at a time and only its binary keys and places are kept (41 bytes a row); the sorted index
        is made one array at a time, and copied again only when a key has several copies."""
        names = ledger.shards()
        keys, ok, shard, row = [], [], [], []
        for i, n in enumerate(names):
            t = ledger.read_shard(n, ["key", "ok"])
            keys.append(binary_keys(t.column("key").combine_chunks()))
            ok.append(t.column("ok").combine_chunks().fill_null(False).to_numpy(zero_copy_only=False).astype(bool))
            shard.append(np.full(t.num_rows, i, dtype=np.int32))
            row.append(np.arange(t.num_rows, dtype=np.int32))
            del t
        if not names:
            return cls(np.zeros(0, "S32"), np.zeros(0, bool), np.zeros(0, np.int32), np.zeros(0, np.int32), [])
        k = np.concatenate(keys)
        del keys
        order = np.argsort(k, kind="stable")  # equal keys stay in shard (time) order: the last of each run wins
        k = k[order]
        last = np.r_[k[1:] != k[:-1], True]
        unique = bool(last.all())
        take = order if unique else order[last]
        del order
        o, s, r = (np.concatenate(x)[take] for x in (ok, shard, row))
        return cls(k if unique else k[last], o, s, r, names)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, keys: list[str]) -> np.ndarray:
        """Position of each key (64 hex digits) in the index, -1 where the ledger lacks it."""
        q = binary_keys(pa.array(keys, pa.string()))
        if not len(self.keys):
            return np.full(len(q), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
        return np.where(self.keys[pos] == q, pos, -1)


_NIBBLE = np.full(256, 255, np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
_NIBBLE[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def binary_keys(keys: pa.Array) -> np.ndarray:
    """Ledger keys (strings of 64 hex digits) -> their 32 bytes each, as an (n,) S32 array in the same order."""
    k = keys.cast(pa.binary(64))  # raises when a key is not 64 bytes long
    if not len(k):
        return np.zeros(0, "S32")
    digits = _NIBBLE[np.frombuffer(k.buffers()[1], np.uint8, count=len(k) * 64, offset=k.offset * 64).reshape(-1, 64)]
    if (digits == 255).any():
        raise ValueError("ledger keys must be 64 hex digits")
    return np.ascontiguousarray((digits[:, 0::2] << 4) | digits[:, 1::2]).view("S32").ravel()


def index_totals(ledger: Ledger, index: KeyIndex) -> dict[str, int]:
    """``table_totals`` of the shards' rows that ``index`` keeps (each key's current row), read a shard at a time and
    without the keys (grouping the 1.2M string keys of the 1M rehearsal's ledger peaked at 883 MB)."""
    out = _row_sums(pa.table({}))
    order = np.argsort(index.shard, kind="stable")
    bounds = np.searchsorted(index.shard[order], np.arange(len(index.shards) + 1))
    for i, name in enumerate(index.shards):
        rows = index.row[order[bounds[i]:bounds[i + 1]]]
        if len(rows):
            t = ledger.read_shard(name, list(ACCOUNTING[1:]))
            for k, v in _row_sums(t.take(pa.array(rows))).items():
                out[k] += v
    return out


def ledger_index(run_root: str, stage: str):
    """(KeyIndex, totals) of a ledger after moving killed writers' journals into a shard; and how many rows were recovered."""
    ledger = Ledger(RunDir(run_root), stage)
    recovered = ledger.recover()
    index = KeyIndex.build(ledger)
    return index, {**index_totals(ledger, index), "recovered": recovered}
