"""The CQG stage's LLM work as plans that ``cqg_ray.llm.stream`` runs in workers: generation and probing.

Generation plan (``questions/generate/plan.parquet``): one row per generation prompt, in cluster order: cluster, the
(shard, row) places of its positives and of its negatives (hard and easy mixed in a seeded order), its keywords.
``GenerateJob`` reads the texts, builds the prompt (``cqg.prompt``: the property prompt or A.1; A.2 for qaemb, its
texts clipped to ``cqg.max_text_chars`` and further, or dropped, until the prompt fits the engine) and, answered,
parses the reply into questions: ``questions/generations.parquet``.

Probe plan (``questions/probe/plan.parquet``): one row per probe text, in cluster order: cluster, doc_id, role, its
place and the candidates it is asked about (their texts in ``questions/probe/candidates.parquet``). ``ProbeJob``
asks every candidate of a cluster about each probe text (A.3, or single-pass) and writes
``questions/probes.parquet``; each batch returns its per-candidate yes and answered counts by role.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from cqg_ray.llm.plan_work import PlanJob

ROLES = ("positive", "hard", "easy")
GENERATE_PLAN = "generate/plan.parquet"  # under the stage folder
PROBE_PLAN = "probe/plan.parquet"
PROBE_CANDIDATES = "probe/candidates.parquet"
GENERATIONS_SCHEMA = pa.schema([("cluster", pa.int32()), ("ok", pa.bool_()), ("text", pa.string()), ("questions", pa.list_(pa.string())),
                                ("dropped", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("key", pa.string())])
PROBES_SCHEMA = pa.schema([("cluster", pa.int32()), ("doc_id", pa.string()), ("role", pa.string()), ("question_ids", pa.list_(pa.int64())),
                           ("answers", pa.list_(pa.bool_())), ("ok", pa.bool_())])


def generation_plan(cfg, samples, places: tuple[np.ndarray, np.ndarray], keywords: dict[int, list[str]] | None = None) -> pa.Table:
    """One row per generation sample that can make a prompt (cqg: positives and negatives; qaemb: articles).
    ``places``: (shard, row) of every document by its row index (as ``Sample`` holds them)."""
    c = cfg.cqg
    shard, row = places
    out: dict[str, list] = {"cluster": [], "pos_shard": [], "pos_row": [], "neg_shard": [], "neg_row": [], "keywords": []}
    for s in samples:
        if c.method == "cqg":
            neg = np.concatenate([s.hard, s.easy])
            neg = np.random.default_rng([c.seed, 3, s.cluster]).permutation(neg)  # hard and easy mixed, as one list
            if len(s.positives) == 0 or len(neg) == 0:
                continue
        else:
            neg = np.zeros(0, np.int64)
            if len(s.positives) == 0:
                continue
        pos = np.asarray(s.positives, np.int64)
        neg = np.asarray(neg, np.int64)
        out["cluster"].append(int(s.cluster))
        out["pos_shard"].append(shard[pos].tolist())
        out["pos_row"].append(row[pos].tolist())
        out["neg_shard"].append(shard[neg].tolist())
        out["neg_row"].append(row[neg].tolist())
        out["keywords"].append((keywords or {}).get(int(s.cluster), []))
    return pa.table(out, schema=pa.schema([("cluster", pa.int32()), ("pos_shard", pa.list_(pa.int32())), ("pos_row", pa.list_(pa.int64())),
                                           ("neg_shard", pa.list_(pa.int32())), ("neg_row", pa.list_(pa.int64())),
                                           ("keywords", pa.list_(pa.string()))]))


def probe_plan(probes, cand: dict[int, list[int]], doc_ids: np.ndarray, places: tuple[np.ndarray, np.ndarray]) -> pa.Table:
    """One row per probe text of a cluster with candidates to ask: cluster, doc_id, role, shard, row, question_index."""
    shard, row = places
    out: dict[str, list] = {"cluster": [], "doc_id": [], "role": [], "shard": [], "row": [], "question_index": []}
    for s in probes:
        qids = cand.get(s.cluster, [])
        if not qids:
            continue
        for role, arr in zip(ROLES, (s.positives, s.hard, s.easy)):
            for i in arr:
                for k, v in (("cluster", int(s.cluster)), ("doc_id", str(doc_ids[i])), ("role", role), ("shard", int(shard[i])),
                             ("row", int(row[i])), ("question_index", list(qids))):
                    out[k].append(v)
    return pa.table(out, schema=pa.schema([("cluster", pa.int32()), ("doc_id", pa.string()), ("role", pa.string()), ("shard", pa.int32()),
                                           ("row", pa.int64()), ("question_index", pa.list_(pa.int32()))]))


def generation_request(cfg, cluster: int, positives: list[str], negatives: list[str], keywords: list[str], fitter):
    """The generation request of one cluster: texts clipped to cqg.max_text_chars, then fitted by ``fitter``."""
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.prompts import clip_text, cqg_messages, property_messages, qaemb_messages

    c = cfg.cqg
    pos = [clip_text(t, c.max_text_chars) for t in positives]
    neg = [clip_text(t, c.max_text_chars) for t in negatives]
    meta = {"cluster": int(cluster)}
    if c.method == "cqg" and c.prompt == "property":
        messages = lambda p, n: property_messages(p, n, c.questions_per_prompt, c.examples, keywords)  # noqa: E731
    elif c.method == "cqg":
        messages = lambda p, n: cqg_messages(p, n, c.questions_per_prompt)  # noqa: E731
    else:
        messages = lambda p, n: qaemb_messages(p, n_questions=c.questions_per_prompt)  # noqa: E731
    build = lambda p, n: Request(messages(p, n), max_tokens=cfg.llm.max_tokens_generate, meta=meta, stop_on_loop=True)  # noqa: E731
    req, _, _ = fitter.contrast(pos, neg, build, what=f"cluster {cluster}")
    return req


def _split(values: list[str], sizes: list[int]) -> list[list[str]]:
    ends = np.cumsum(sizes)
    return [values[e - n: e] for n, e in zip(sizes, ends)]


class GenerateJob(PlanJob):
    """Generation prompts of a batch of clusters, and their parsed questions."""

    plan = GENERATE_PLAN
    parts = {"generations": GENERATIONS_SCHEMA}

    def requests(self, group: int) -> tuple[list, pa.Table]:
        plan = self.read(group)
        cols = {k: plan.column(k).to_pylist() for k in ("pos_shard", "pos_row", "neg_shard", "neg_row")}
        sizes = [len(p) for p in cols["pos_row"]] + [len(n) for n in cols["neg_row"]]
        shard = np.array([s for x in cols["pos_shard"] + cols["neg_shard"] for s in x], np.int32)
        row = np.array([r for x in cols["pos_row"] + cols["neg_row"] for r in x], np.int64)
        texts = _split(self.texts.get(shard, row), sizes)  # every text of the batch in one read
        n = plan.num_rows
        reqs = [generation_request(self.cfg, k, texts[i], texts[n + i], kw, self.fitter)
                for i, (k, kw) in enumerate(zip(plan.column("cluster").to_pylist(), plan.column("keywords").to_pylist()))]
        return reqs, plan

    def assemble(self, group: int, reqs: list, results: list[dict | None], plan: pa.Table) -> dict[str, Any]:
        from cqg_ray.llm.parse import parse_questions

        rows: dict[str, list] = {n: [] for n in GENERATIONS_SCHEMA.names}
        dropped_total: dict[str, int] = {}
        for r, res in zip(reqs, results):
            if res is None:
                continue
            qs = parse_questions(res["text"] or "") if res["ok"] else []
            d = getattr(qs, "dropped", {})
            for k, v in d.items():
                dropped_total[k] = dropped_total.get(k, 0) + v
            for col, v in (("cluster", r.meta["cluster"]), ("ok", bool(res["ok"])), ("text", res["text"] or ""), ("questions", list(qs)),
                           ("dropped", json.dumps(d)), ("prompt_tokens", int(res["prompt_tokens"] or 0)),
                           ("completion_tokens", int(res["completion_tokens"] or 0)), ("key", res["key"])):
                rows[col].append(v)
        self.write_part("generations", group, pa.table(rows, schema=GENERATIONS_SCHEMA))
        return {"prompts": len(reqs), "failed": sum(not ok for ok in rows["ok"]), "dropped": dropped_total}


class ProbeJob(PlanJob):
    """Probe prompts of a batch of probe texts, their answers, and per-candidate counts by role."""

    plan = PROBE_PLAN
    parts = {"probes": PROBES_SCHEMA}

    def open(self, backend: Any) -> None:
        super().open(backend)
        self.candidates = self.run.read_table(f"{self.stage}/{PROBE_CANDIDATES}").column("text").to_pylist()

    def requests(self, group: int) -> tuple[list, pa.Table]:
        from cqg_ray.llm.answers import answer_requests
        from cqg_ray.llm.prompts import clip_text

        plan = self.read(group)
        texts = self.texts.get(plan.column("shard").to_numpy(), plan.column("row").to_numpy())
        cfg, reqs = self.cfg, []
        for k, doc_id, role, qids, text in zip(plan.column("cluster").to_pylist(), plan.column("doc_id").to_pylist(),
                                               plan.column("role").to_pylist(), plan.column("question_index").to_pylist(), texts):
            meta = {"cluster": int(k), "doc_id": doc_id, "role": role}
            build = lambda t, qids=qids, meta=meta: answer_requests(t, qids, self.candidates, cfg.llm.answer_mode,  # noqa: E731
                                                                    cfg.label.questions_per_prompt, cfg.llm.max_tokens_answer, meta=meta)
            reqs.extend(self.fitter.text(clip_text(text, cfg.cqg.max_text_chars), build, what=f"probe text {doc_id} (cluster {k})"))
        return reqs, plan

    def assemble(self, group: int, reqs: list, results: list[dict | None], plan: pa.Table) -> dict[str, Any]:
        rows: dict[str, list] = {n: [] for n in PROBES_SCHEMA.names}
        counts: dict[tuple[int, int], list[int]] = {}  # (candidate, role) -> [yes, answered]
        for r, res in zip(reqs, results):
            if res is None:
                continue
            ok = bool(res["ok"]) and res["answers"] is not None
            for col, v in (("cluster", r.meta["cluster"]), ("doc_id", r.meta["doc_id"]), ("role", r.meta["role"]),
                           ("question_ids", r.meta["question_ids"]), ("answers", res["answers"]), ("ok", bool(res["ok"]))):
                rows[col].append(v)
            if not ok:
                continue
            role = ROLES.index(r.meta["role"])
            for q, a in zip(r.meta["question_ids"], res["answers"]):
                c = counts.setdefault((int(q), role), [0, 0])
                c[0] += int(a)
                c[1] += 1
        self.write_part("probes", group, pa.table(rows, schema=PROBES_SCHEMA))
        return {"prompts": len(reqs), "failed": sum(not ok for ok in rows["ok"]),
                "probe_counts": [[q, role, y, n] for (q, role), (y, n) in sorted(counts.items())]}


def fold_probe_counts(counts: dict[str, np.ndarray], part: dict) -> None:
    """Add a probe batch's ``probe_counts`` ([candidate, role, yes, answered] rows) into per-candidate arrays; taken out of ``part``."""
    for q, role, y, n in part.pop("probe_counts", []):
        counts[f"{ROLES[role]}_yes"][q] += y
        counts[f"{ROLES[role]}_n"][q] += n
