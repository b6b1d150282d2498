"""The labelling stage's work on one batch of its plan (no Ray here: ``cqg_ray.mbqa.label`` maps it over Ray Data).

The plan is a Parquet file, one row per planned prompt (``plan_table``), its row groups the batches. A worker
reads one row group, reads the batch's texts from the corpus shards itself, builds the requests, keys them
(``ledger.request_key``, the same keys as ever) and then, by ``mode``:

    count      how many of the batch's requests the ledger holds (a resume's log line; nothing sent)
    answer     sends the ones it lacks through the engine (``runner.answer_pending``: the runner's retry rules) and
               writes the rows into the ledger itself (``BatchWriter``: journal + large shards)
    assemble   looks the batch's keys up in the ledger (``KeyIndex``) and writes its labels and failures as Parquet parts

Each returns counters (a small dict); the driver only adds them up. ``KeyIndex`` is the ledger's key column, sorted,
with where each key's row lies (shard, row): built once per pass, shared read-only with every worker.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.config import PipelineConfig
from cqg_ray.llm.ledger import Ledger, request_key, worker_journal

PLAN = "plan/plan.parquet"  # under the stage folder
PARTS = "parts"  # under the stage folder: the assemble pass's Parquet parts
SOURCES = np.array(["cluster", "neighbor", "random"])
LABELS_SCHEMA = pa.schema([("doc_id", pa.string()), ("question_id", pa.int32()), ("answer", pa.bool_()), ("p_yes", pa.float32()),
                           ("source", pa.string())])
FAILURES_SCHEMA = pa.schema([("doc_id", pa.string()), ("question_ids", pa.list_(pa.int32())), ("text", pa.string()), ("error", pa.string())])
RESULT_COLUMNS = ["key", "ok", "text", "error", "answers", "p_yes"]
FIT_COUNTS = ("checked", "clipped", "texts_dropped", "chars_cut")


def plan_table(plan, doc_ids: np.ndarray, doc_shard: np.ndarray, doc_row: np.ndarray) -> pa.Table:
    """One row per planned prompt, in corpus order (shard, row) so a batch reads few shards: prompt_id, doc_id, shard,
    row, question_index (list<int32>), source (list<int8>, aligned). ``doc_shard``/``doc_row`` place each text."""
    n = plan.n_prompts
    src_key = plan.pair_doc.astype(np.int64) * (int(plan.pair_question.max(initial=0)) + 1) + plan.pair_question
    src_order = np.argsort(src_key)
    q = plan.prompt_questions.astype(np.int64)
    prompt_doc_of_q = np.repeat(plan.prompt_doc, np.diff(plan.prompt_offsets))
    pos = src_order[np.searchsorted(src_key, prompt_doc_of_q * (int(plan.pair_question.max(initial=0)) + 1) + q, sorter=src_order)]
    sources = plan.pair_source[pos].astype(np.int8)
    offsets = pa.array(plan.prompt_offsets.astype(np.int32))
    table = pa.table({
        "prompt_id": np.arange(n, dtype=np.int64),
        "doc_id": pa.array(doc_ids[plan.prompt_doc], pa.string()),
        "shard": doc_shard[plan.prompt_doc].astype(np.int32),
        "row": doc_row[plan.prompt_doc].astype(np.int64),
        "question_index": pa.ListArray.from_arrays(offsets, pa.array(plan.prompt_questions.astype(np.int32))),
        "source": pa.ListArray.from_arrays(offsets, pa.array(sources)),
    })
    order = np.lexsort((np.arange(n), table.column("row").to_numpy(), table.column("shard").to_numpy()))
    return table.take(order)


def batch_rows(questions_per_prompt: int, pairs: int = 10_000) -> int:
    """Plan rows (prompts) per batch: about ``pairs`` (text, question) pairs."""
    return max(1, pairs // questions_per_prompt)


@dataclass
class KeyIndex:
    """The ledger's keys, sorted (fixed 64-byte hex), each with its row's place (shard name, row) and ok flag."""

    keys: np.ndarray
    ok: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    shards: list[str]

    @classmethod
    def build(cls, ledger: Ledger) -> "KeyIndex":
        """From the shards' key and ok columns only (journals must be recovered first). The last copy of a key wins."""
        names = ledger.shards()
        keys, ok, shard, row = [], [], [], []
        for i, n in enumerate(names):
            t = pq.read_table(ledger.run.path(ledger.folder, n), columns=["key", "ok"], filesystem=ledger.run.fs)
            k = t.column("key").combine_chunks().cast(pa.binary(64))
            keys.append(np.frombuffer(k.buffers()[1], dtype="S64", count=len(k), offset=k.offset * 64) if len(k) else np.zeros(0, "S64"))
            ok.append(t.column("ok").combine_chunks().fill_null(False).to_numpy(zero_copy_only=False).astype(bool))
            shard.append(np.full(t.num_rows, i, dtype=np.int32))
            row.append(np.arange(t.num_rows, dtype=np.int64))
        if not names:
            return cls(np.zeros(0, "S64"), np.zeros(0, bool), np.zeros(0, np.int32), np.zeros(0, np.int64), [])
        k, o, s, r = (np.concatenate(x) for x in (keys, ok, shard, row))
        order = np.argsort(k, kind="stable")  # equal keys stay in shard (time) order: the last of each run wins
        k, o, s, r = k[order], o[order], s[order], r[order]
        last = np.r_[k[1:] != k[:-1], True]
        return cls(k[last], o[last], s[last], r[last], names)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, keys: list[str]) -> np.ndarray:
        """Position of each key in the index, -1 where the ledger lacks it."""
        q = np.array(keys, dtype="S64")
        if not len(self.keys):
            return np.full(len(q), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, q), len(self.keys) - 1)
        return np.where(self.keys[pos] == q, pos, -1)


class LabelWorker:
    """Builds, keys, answers and assembles batches of the labelling plan (one per Ray Data actor, or one in-process).

    ``engine`` makes the backend on first use (a worker that only counts or assembles never loads a model);
    ``index`` is the ledger's ``KeyIndex`` (or a Ray object reference to one, fetched here, shared memory)."""

    def __init__(self, run_root: str, stage: str, cfg: PipelineConfig, identity: dict, index: Any = None,
                 engine: Callable[[], Any] | None = None, backend: Any = None, retry_failed: bool = False):
        from cqg_ray.rundir import RunDir

        self.run, self.stage, self.cfg, self.identity = RunDir(run_root), stage, cfg, identity
        if index is not None and not isinstance(index, KeyIndex):
            import ray

            index = ray.get(index)
        self.index: KeyIndex | None = index
        self.engine, self.backend, self.retry = engine, backend, retry_failed or cfg.llm.retry_failed
        self.owns_backend = backend is None
        self.questions: list[str] | None = None
        self.fitter: Any = None
        self.writer: Any = None
        self._text_shard: tuple[int, pa.ChunkedArray] | None = None
        self._result_shard: tuple[int, pa.Table] | None = None

    # ------------------------------------------------------------------ requests of a batch

    def _setup(self) -> None:
        if self.questions is not None:
            return
        from cqg_ray.artifacts import corpus_shards, load_questions
        from cqg_ray.llm.fit import PromptFitter, stage_budget

        self.questions = load_questions(self.run).column("text").to_pylist()
        self.corpus = corpus_shards(self.run)
        self.fitter = PromptFitter(stage_budget(self.cfg.llm, self.backend), "labels")

    def _texts(self, shard: np.ndarray, row: np.ndarray) -> list[str]:
        out: list[str] = [""] * len(shard)
        for s in np.unique(shard):
            if self._text_shard is None or self._text_shard[0] != s:
                self._text_shard = (int(s), pq.read_table(self.corpus[int(s)], columns=["text"], filesystem=self.run.fs).column("text"))
            at = np.flatnonzero(shard == s)
            for i, t in zip(at, self._text_shard[1].take(pa.array(row[at])).to_pylist()):
                out[i] = t
        return out

    def requests(self, group: int) -> tuple[list, list[str], pa.Table]:
        """The requests of plan row group ``group``, their keys, and the plan rows (request i's row: ``meta['row']``)."""
        from cqg_ray.llm.answers import answer_requests
        from cqg_ray.llm.prompts import clip_text

        self._setup()
        plan = pq.ParquetFile(self.run.path(self.stage, PLAN), filesystem=self.run.fs).read_row_group(group)
        texts = self._texts(plan.column("shard").to_numpy(), plan.column("row").to_numpy())
        cfg, reqs = self.cfg, []
        for i, (doc_id, qids, text) in enumerate(zip(plan.column("doc_id").to_pylist(), plan.column("question_index").to_pylist(), texts)):
            build = lambda t: answer_requests(t, qids, self.questions, cfg.llm.answer_mode, cfg.label.questions_per_prompt,  # noqa: E731
                                              cfg.llm.max_tokens_answer, meta={"doc_id": doc_id, "row": i})
            reqs.extend(self.fitter.text(clip_text(text, cfg.label.max_text_chars), build, what=f"text {doc_id}"))
        keys = [request_key(self.identity, r, cfg.llm.logprobs) for r in reqs]
        return reqs, keys, plan

    def _fit_counts(self) -> dict[str, int]:
        c, self.fitter.counts = self.fitter.counts, {k: 0 for k in self.fitter.counts}
        return c

    def _done(self, keys: list[str]) -> np.ndarray:
        if self.index is None or not len(self.index):
            return np.zeros(len(keys), dtype=bool)
        pos = self.index.find(keys)
        return (pos >= 0) & (self.index.ok[np.maximum(pos, 0)] | (not self.retry))

    # ------------------------------------------------------------------ the three passes

    def count(self, group: int) -> dict[str, Any]:
        reqs, keys, _ = self.requests(group)
        done = self._done(keys)
        unique = len(set(keys))
        from_ledger = len({k for k, d in zip(keys, done) if d})
        return {"requests": len(reqs), "unique": unique, "from_ledger": from_ledger, "to_send": unique - from_ledger,
                "fit": self._fit_counts()}

    def answer(self, group: int) -> dict[str, Any]:
        from cqg_ray.llm.backends import make_backend
        from cqg_ray.llm.ledger import BatchWriter
        from cqg_ray.llm.runner import _Pending, _prefix_order, answer_pending, new_run_stats

        t0 = time.time()
        reqs, keys, _ = self.requests(group)
        self._fit_counts()
        done = self._done(keys)
        todo: dict[str, Any] = {}
        for k, r, d in zip(keys, reqs, done):
            if not d and k not in todo:
                todo[k] = _Pending(k, r)
        counters = new_run_stats(t0, len(reqs), len(set(keys)), len(set(keys)) - len(todo), len(todo))
        if todo:
            if self.backend is None:
                self.backend = self.engine() if self.engine is not None else make_backend(self.cfg.llm, in_process=True, cluster=self.cfg.ray)
            if self.writer is None:
                llm = self.cfg.llm
                self.writer = BatchWriter(Ledger(self.run, "labels", journal=worker_journal()), llm.flush_every, llm.flush_s)
            pending = sorted(todo.values(), key=lambda p: _prefix_order(p.request))
            answer_pending(pending, self.backend, self.cfg.llm, "labels", self.writer.add, counters)
        counters["shards"] = self.writer.shards if self.writer is not None else 0
        counters["wall_s"] = round(time.time() - t0, 3)
        return counters

    def close(self) -> None:
        """Write what is buffered as a shard (an in-process run; Ray workers leave it in their journal for ``recover``)."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.ledger.close()
        if self.backend is not None and self.owns_backend:
            self.backend.close()

    def _results(self, pos: np.ndarray) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = [None] * len(pos)
        assert self.index is not None
        shard = np.where(pos >= 0, self.index.shard[np.maximum(pos, 0)], -1)
        ledger = Ledger(self.run, "labels")
        for s in np.unique(shard[shard >= 0]):
            if self._result_shard is None or self._result_shard[0] != s:
                path = self.run.path(ledger.folder, self.index.shards[int(s)])
                self._result_shard = (int(s), pq.read_table(path, columns=RESULT_COLUMNS, filesystem=self.run.fs))
            at = np.flatnonzero(shard == s)
            rows = self._result_shard[1].take(pa.array(self.index.row[pos[at]])).to_pylist()
            for i, r in zip(at, rows):
                out[i] = r
        return out

    def assemble(self, group: int) -> dict[str, Any]:
        """Labels and failures of the batch from the ledger, written as parts; counters: pairs, yes, per-question counts."""
        reqs, keys, plan = self.requests(group)
        fit = self._fit_counts()
        m = len(self.questions or [])
        results = self._results(self.index.find(keys) if self.index is not None else np.full(len(keys), -1))
        sources = plan.column("source").to_pylist()
        qindex = plan.column("question_index").to_pylist()
        lab: dict[str, list] = {n: [] for n in LABELS_SCHEMA.names}
        fails: dict[str, list] = {n: [] for n in FAILURES_SCHEMA.names}
        missing = 0
        for r, res in zip(reqs, results):
            if res is None:
                missing += 1
                continue
            if not res["ok"] or res["answers"] is None:
                for n, v in zip(FAILURES_SCHEMA.names, (r.meta["doc_id"], r.meta["question_ids"], res["text"] or "", res["error"] or "")):
                    fails[n].append(v)
                continue
            src = dict(zip(qindex[r.meta["row"]], sources[r.meta["row"]]))
            for j, q in enumerate(r.meta["question_ids"]):
                lab["doc_id"].append(r.meta["doc_id"])
                lab["question_id"].append(q)
                lab["answer"].append(bool(res["answers"][j]))
                lab["p_yes"].append(None if res["p_yes"] is None else res["p_yes"][j])
                lab["source"].append(str(SOURCES[src[q]]))
        labels = pa.table(lab, schema=LABELS_SCHEMA)
        name = f"{group:09d}-{uuid.uuid4().hex[:6]}"
        self.run.write_table(f"{self.stage}/{PARTS}/labels-{name}.parquet", labels)
        if fails["doc_id"]:
            self.run.write_table(f"{self.stage}/{PARTS}/failures-{name}.parquet", pa.table(fails, schema=FAILURES_SCHEMA))
        qid = np.asarray(lab["question_id"], dtype=np.int64)
        ans = np.asarray(lab["answer"], dtype=np.int64)
        return {"requests": len(reqs), "pairs_labelled": labels.num_rows, "prompts_failed": len(fails["doc_id"]), "missing": missing,
                "yes": int(ans.sum()), "answered": np.bincount(qid, minlength=m).tolist(),
                "yes_per_question": np.bincount(qid, weights=ans, minlength=m).astype(np.int64).tolist(), "fit": fit}
