"""The request ledger: every finished LLM call of a stage, in Parquet shards under the run directory.

    <run>/llm/ledger/<stage>/<time_ns>-<uid>.parquet    one shard per flush (key, text, ok, answers, tokens, ...)
    <run>/llm/ledger/<stage>/_stats.json                per-stage accounting (totals + one entry per run)

A request's key is a hash of (backend and model identity, chat messages, max_tokens, n_answers, logprobs);
its ``meta`` is not part of it. A shard is written atomically (temp file + rename on local disks, one PUT on
object stores), so a killed process leaves whole shards only; the same key in two shards (a compaction
killed midway) is harmless: the last one read wins.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import pyarrow as pa

from cqg_ray.llm.base import Request
from cqg_ray.rundir import RunDir

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


def request_key(identity: dict[str, Any], req: Request, logprobs: bool = False) -> str:
    """sha256 of what decides a reply: model identity (backend, model, temperature, constrained), prompt, limits."""
    payload = {
        "model": identity,
        "messages": req.messages,
        "max_tokens": req.max_tokens,
        "n_answers": req.n_answers,
        "logprobs": bool(logprobs and req.n_answers is not None),
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Ledger:
    def __init__(self, run: RunDir, stage: str):
        if not stage or "/" in stage:
            raise ValueError(f"ledger stage must be a plain name, got {stage!r}")
        self.run = run
        self.stage = stage
        self.folder = f"llm/ledger/{stage}"

    def shards(self) -> list[str]:
        return self.run.ls(self.folder, suffix=".parquet")

    def load(self) -> dict[str, dict[str, Any]]:
        """key -> finished row (dict with the SCHEMA's fields); {} for a new stage."""
        if not self.shards():
            return {}
        table = self.run.read_table(self.folder)
        return {row["key"]: row for row in table.to_pylist()}

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Write one shard with these finished rows (no-op for none)."""
        if not rows:
            return
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in SCHEMA} for r in rows], schema=SCHEMA)
        self.run.write_table(f"{self.folder}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet", table)

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
