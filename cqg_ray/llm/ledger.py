"""The request ledger: every finished LLM call of a stage, in Parquet shards under the run directory.

    <run>/llm/ledger/<stage>/<time_ns>-<uid>.parquet    one shard per flush (key, text, ok, answers, tokens, ...)
    <run>/llm/ledger/<stage>/_journal.jsonl             each finished row, appended the moment it finishes
    <run>/llm/ledger/<stage>/_stats.json                per-stage accounting (totals + one entry per run)

A request's key is a hash of (backend and model identity, chat messages, max_tokens, n_answers, logprobs);
its ``meta`` is not part of it. A shard is written atomically (temp file + rename on local disks, one PUT on
object stores), so a killed process leaves whole shards only; the same key in two shards (a compaction
killed midway) is harmless: the last one read wins.

Between two shards, every finished row is also appended to the journal as one JSON line, written through to
the operating system before the next request is judged; the journal is emptied once its rows are in a shard.
So a process killed at any moment (SIGKILL included) loses only the requests in flight: ``load`` reads the
shards and the journal (a torn last line is ignored). Object stores cannot append; there the journal is off and
a kill loses at most the rows since the last shard (``llm.flush_every``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from typing import Any

import pyarrow as pa

from cqg_ray.llm.base import Request
from cqg_ray.rundir import RunDir

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
JOURNAL = "_journal.jsonl"


def schema_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row with exactly the SCHEMA's fields (what a shard and a journal line hold)."""
    return {f.name: row.get(f.name) for f in SCHEMA}


def request_key(identity: dict[str, Any], req: Request, logprobs: bool = False) -> str:
    """sha256 of what decides a reply: model identity (backend, model, temperature, constrained), prompt, limits."""
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
    def __init__(self, run: RunDir, stage: str):
        if not stage or "/" in stage:
            raise ValueError(f"ledger stage must be a plain name, got {stage!r}")
        self.run = run
        self.stage = stage
        self.folder = f"llm/ledger/{stage}"
        self._journal: Any = None  # an open append stream while rows are journalled
        self.journal_supported = True

    def shards(self) -> list[str]:
        return self.run.ls(self.folder, suffix=".parquet")

    def load(self) -> dict[str, dict[str, Any]]:
        """key -> finished row (dict with the SCHEMA's fields): the shards, then the journal; {} for a new stage."""
        rows: dict[str, dict[str, Any]] = {}
        if self.shards():
            rows = {row["key"]: row for row in self.run.read_table(self.folder).to_pylist()}
        for row in self.journal_rows():
            rows[row["key"]] = row
        return rows

    def journal_rows(self) -> list[dict[str, Any]]:
        """The rows journalled since the last shard; a line torn by a kill (the last one) is skipped."""
        if not self.run.exists(self.folder, JOURNAL):
            return []
        rows = []
        for line in self.run.read_bytes(f"{self.folder}/{JOURNAL}").split(b"\n"):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # empty or torn
            if isinstance(row, dict) and isinstance(row.get("key"), str):
                rows.append(row)
        return rows

    def record(self, row: dict[str, Any]) -> None:
        """Journal one finished row now (one line, flushed to the OS): a kill after this cannot lose it."""
        if not self.journal_supported:
            return
        if self._journal is None:
            self.run.makedirs(self.folder)
            try:
                self._journal = self.run.fs.open_append_stream(self.run.path(self.folder, JOURNAL), compression=None)
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

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write one shard with these finished rows (no-op for none), then empty the journal.

        Callers pass every row journalled since the last shard (and may pass more): the journal's rows are then
        all in a shard. A kill between the two steps leaves them in both, which is harmless.
        """
        if rows:
            table = pa.Table.from_pylist([schema_row(r) for r in rows], schema=SCHEMA)
            self.run.write_table(f"{self.folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet", table)
        self.close()
        self.run.rm(self.folder, JOURNAL)

    def recover(self) -> int:
        """Move rows a killed run left in the journal into a shard; returns how many there were."""
        rows = self.journal_rows()
        self.append(rows)  # with none, this only removes a journal holding nothing readable
        return len(rows)

    def compact(self, min_shards: int = 64) -> int:
        """Merge the shards into one when there are at least ``min_shards``; returns the shard count after."""
        names = self.shards()
        if len(names) < min_shards:
            return len(names)
        rows = self.load()
        self.append(list(rows.values()))  # written first: a kill below leaves duplicates, never a loss
        for n in names:
            self.run.rm(self.folder, n)
        return len(self.shards())

    def read_stats(self) -> dict[str, Any]:
        if not self.run.exists(self.folder, STATS):
            return {"stage": self.stage, "totals": {}, "runs": []}
        return self.run.read_json(f"{self.folder}/{STATS}")

    def write_stats(self, stats: dict[str, Any]) -> None:
        self.run.write_json(f"{self.folder}/{STATS}", stats)


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
