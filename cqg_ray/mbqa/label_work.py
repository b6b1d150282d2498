"""The labelling stage's plan and its job (``cqg_ray.llm.stream`` runs the passes; no Ray here).

The plan is a Parquet file, one row per planned prompt (``plan_table``), its row groups the batches. ``LabelJob``
reads one row group, reads the batch's texts from the corpus shards, builds the requests (keyed by the stream
worker with ``ledger.request_key``, the same keys as ever) and, given their ledger rows, writes the batch's labels
and failures as Parquet parts and returns counters: pairs, yes, per-question counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from cqg_ray.llm.plan_work import PlanJob

PLAN = "plan/plan.parquet"  # under the stage folder
SOURCES = np.array(["cluster", "neighbor", "random"])
LABELS_SCHEMA = pa.schema([("doc_id", pa.string()), ("question_id", pa.int32()), ("answer", pa.bool_()), ("p_yes", pa.float32()),
                           ("source", pa.string())])
FAILURES_SCHEMA = pa.schema([("doc_id", pa.string()), ("question_ids", pa.list_(pa.int32())), ("text", pa.string()), ("error", pa.string())])


def plan_table(plan, doc_ids, doc_shard: np.ndarray, doc_row: np.ndarray) -> pa.Table:
    """One row per planned prompt, in corpus order (shard, row) so a batch reads few shards: prompt_id, doc_id, shard,
    row, question_index (list<int32>), source (list<int8>, aligned). ``doc_ids``: the corpus ids (an Arrow string array,
    or anything ``pa.array`` takes); ``doc_shard``/``doc_row`` place each text."""
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
        "doc_id": pa.array(doc_ids, pa.string()).take(plan.prompt_doc),
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


class LabelJob(PlanJob):
    """Requests of a batch of the labelling plan, and its labels and failures from their ledger rows."""

    plan = PLAN
    parts = {"labels": LABELS_SCHEMA, "failures": FAILURES_SCHEMA}

    def open(self, backend: Any) -> None:
        from cqg_ray.artifacts import load_questions

        super().open(backend)
        self.questions = load_questions(self.run).column("text").to_pylist()

    def requests(self, group: int) -> tuple[list, pa.Table]:
        """The requests of plan row group ``group`` (request i's plan row: ``meta['row']``) and the plan rows."""
        from cqg_ray.llm.answers import answer_requests
        from cqg_ray.llm.prompts import clip_text

        plan = self.read(group)
        texts = self.texts.get(plan.column("shard").to_numpy(), plan.column("row").to_numpy())
        cfg, reqs = self.cfg, []
        for i, (doc_id, qids, text) in enumerate(zip(plan.column("doc_id").to_pylist(), plan.column("question_index").to_pylist(), texts)):
            build = lambda t: answer_requests(t, qids, self.questions, cfg.llm.answer_mode, cfg.label.questions_per_prompt,  # noqa: E731
                                              cfg.llm.max_tokens_answer, meta={"doc_id": doc_id, "row": i}, prompt=cfg.label.prompt)
            reqs.extend(self.fitter.text(clip_text(text, cfg.label.max_text_chars), build, what=f"text {doc_id}"))
        return reqs, plan

    def assemble(self, group: int, reqs: list, results: list[dict | None], plan: pa.Table) -> dict[str, Any]:
        from cqg_ray.llm.answers import labelled_yes

        m = len(self.questions)
        sources = plan.column("source").to_pylist()
        qindex = plan.column("question_index").to_pylist()
        lab: dict[str, list] = {n: [] for n in LABELS_SCHEMA.names}
        fails: dict[str, list] = {n: [] for n in FAILURES_SCHEMA.names}
        for r, res in zip(reqs, results):
            if res is None:
                continue
            if not res["ok"] or res["answers"] is None:
                for n, v in zip(FAILURES_SCHEMA.names, (r.meta["doc_id"], r.meta["question_ids"], res["text"] or "", res["error"] or "")):
                    fails[n].append(v)
                continue
            src = dict(zip(qindex[r.meta["row"]], sources[r.meta["row"]]))
            for j, q in enumerate(r.meta["question_ids"]):
                p_yes = None if res["p_yes"] is None else res["p_yes"][j]
                lab["doc_id"].append(r.meta["doc_id"])
                lab["question_id"].append(q)
                lab["answer"].append(labelled_yes(r, p_yes, res["answers"][j], self.cfg.label.yes_above))
                lab["p_yes"].append(p_yes)
                lab["source"].append(str(SOURCES[src[q]]))
        labels = pa.table(lab, schema=LABELS_SCHEMA)
        self.write_part("labels", group, labels)
        if fails["doc_id"]:
            self.write_part("failures", group, pa.table(fails, schema=FAILURES_SCHEMA))
        qid = np.asarray(lab["question_id"], dtype=np.int64)
        ans = np.asarray(lab["answer"], dtype=np.int64)
        return {"requests": len(reqs), "pairs_labelled": labels.num_rows, "prompts_failed": len(fails["doc_id"]),
                "yes": int(ans.sum()), "answered": np.bincount(qid, minlength=m).tolist(),
                "yes_per_question": np.bincount(qid, weights=ans, minlength=m).astype(np.int64).tolist()}
