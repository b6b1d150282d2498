"""The three table tasks (STS, retrieval, clustering): their datasets, and every method scored on one dataset; and
the texts of the faithfulness task (``cqg_ray.evaluate.faithfulness`` scores it).

``SCORERS[task](data, methods, curves)`` gives each method's scores on one dataset, keyed as ``results["scores"]``
is (STS also gives the cognitive load of binary embeddings), and for retrieval and clustering the budget sweep's
points (``curves``: {model name: {rule: [Budget per k]}}); ``evaluate_sts`` / ``evaluate_retrieval`` /
``evaluate_clustering`` score any one Encoder.

Retrieval and clustering stream their text sets: texts are embedded ``DOC_BATCH`` at a time, and a model's
probabilities live only while their batch is scored. Retrieval keeps each query's running top 11 per method and per
sweep budget (``metrics.CosineTopK``), clustering the budgeted vectors as sparse rows (the active questions), made
dense one vector set at a time for k-means, which needs every point. So no n x m probabilities of a corpus are ever
held; the scores equal those of embedding the whole set at once (exactly when it fits one batch; beyond that, up to
the encoder's own dependence on batch composition).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.data import (
    ClusteringData,
    DataError,
    RetrievalData,
    StsData,
    default_data_root,
    default_datasets,
    load_beir,
    load_clustering,
    load_sts,
)
from cqg_ray.evaluate.methods import Method, embed_texts
from cqg_ray.evaluate.metrics import (
    CosineTopK,
    cognitive_load,
    kmeans_v_measure,
    ndcg_at_k,
    ranking_from_indices,
    sts_na_reason,
    sts_spearman,
    top_k_cosine,
)
from cqg_ray.evaluate.models import budgeted
from cqg_ray.evaluate.sweeps import StsProbs
from cqg_ray.textfiles import TextsData, load_texts

TASKS = ("sts", "retrieval", "clustering")
DOC_BATCH = 16384  # texts of a retrieval corpus or clustering set embedded and scored at a time
Curves = dict[str, dict[str, list]]  # {model name: {budget rule: [Budget per k]}} (sweeps.budget_curves)


# ----------------------------------------------------------------------------------------- datasets


def load_datasets(
    cfg: EvaluateConfig,
    data_root: str | None = None,
    max_queries: int | None = None,
    clustering_field: str = "text",
    seed: int = 0,
) -> dict[str, list]:
    """Every dataset of the configured tasks; a task with no paths uses the standard sets under the data root."""
    root = data_root or default_data_root()
    defaults = default_datasets(root) if root else {"sts": [], "retrieval": [], "clustering": []}
    out: dict[str, list] = {}
    for task in (t for t in cfg.tasks if t in TASKS):
        paths = list(getattr(cfg, task)) or defaults[task]
        if not paths:
            raise DataError(
                f"no {task} datasets: give paths (evaluate.{task} in the config, or on the command line) "
                f"or a data root with the layout of ../shared/data (env CQG_RAY_DATA)"
            )
        if task == "sts":
            out[task] = [load_sts(p, max_pairs=cfg.max_pairs, seed=seed) for p in paths]
        elif task == "retrieval":
            out[task] = [load_beir(p, max_queries=max_queries, max_docs=cfg.max_docs, seed=seed) for p in paths]
        else:
            out[task] = [load_clustering(p, field=clustering_field, max_docs=cfg.max_docs, seed=seed) for p in paths]
        names = [d.name for d in out[task]]
        for i, d in enumerate(out[task]):  # two files with the same short name get a suffix
            if names.count(d.name) > 1:
                d.name = f"{d.name}#{i + 1}"
    if "retrieval" in out:
        keep = set(cfg.keep_identical_ids)
        for d in out["retrieval"]:
            d.drop_identical_ids = not keep & {d.name, d.path}
        unknown = keep - {x for d in out["retrieval"] for x in (d.name, d.path)}
        if unknown:
            raise DataError(f"evaluate.keep_identical_ids names {sorted(unknown)}, which are not retrieval sets here "
                            f"(sets: {[d.name for d in out['retrieval']]})")
    return out


def load_faithfulness_texts(cfg: EvaluateConfig, data_root: str | None = None) -> list[TextsData]:
    """The text files of the faithfulness task (``evaluate.faithfulness.texts``, else STS-B test under the data root)."""
    root = data_root or default_data_root()
    paths = list(cfg.faithfulness.texts) or (default_datasets(root)["faithfulness"] if root else [])
    if not paths:
        raise DataError("no texts for the faithfulness task: give --texts FILE (JSONL with a text field, or TSV) "
                        "or a data root with the layout of ../shared/data (env CQG_RAY_DATA)")
    return [load_texts(p) for p in paths]


def dataset_info(task: str, d: Any) -> dict:
    """What ``results["datasets"]`` records of one dataset."""
    if task == "sts":
        return {"path": d.path, "pairs": len(d)}
    if task == "faithfulness":
        return {"path": d.path, "texts": len(d)}
    if task == "retrieval":
        return {"path": d.path, "queries": len(d.query_ids), "docs": len(d.docs), "full_corpus": d.full_corpus,
                "qrels": sum(len(v) for v in d.qrels.values()), "identical_ids": d.identical_ids,
                "identical_ids_dropped": d.drop_identical_ids, "qrels_docs": d.qrels_docs, "qrels_docs_missing": d.qrels_docs_missing}
    return {"path": d.path, "texts": len(d.texts), "labels": d.n_labels, "field": d.field}


# ----------------------------------------------------------------------------------------- one method, one dataset


def sts_scores(X: Any, data: StsData, i1: np.ndarray, i2: np.ndarray, binary: bool) -> dict:
    """Spearman x100 (and cognitive load for binary embeddings) of embeddings X of ``data.unique_texts()``."""
    u, v = X[i1], X[i2]
    out = {"spearman": sts_spearman(u, v, data.scores)}
    if binary:
        out["cognitive_load"] = cognitive_load(u, v)
    return out


def ranked_ndcg(idx: np.ndarray, data: RetrievalData, k: int = 10) -> float:
    """nDCG@k x100 of top-(k + 1) document indices per query: the query's own id dropped unless the set keeps it."""
    ranked = ranking_from_indices(data.query_ids, data.doc_ids, idx, k=k, drop_identical=data.drop_identical_ids)
    return ndcg_at_k(ranked, data.qrels, k=k)


def retrieval_score(Q: Any, D: Any, data: RetrievalData, k: int = 10) -> float:
    """nDCG@k x100, exact top-k by cosine over all of ``data.docs`` (one spare for a dropped identical id)."""
    _, idx = top_k_cosine(Q, D, k=k + 1)
    return ranked_ndcg(idx, data, k)


def evaluate_sts(encoder: Any, data: StsData, binary: bool | None = None) -> dict:
    """Library helper: STS scores of any Encoder (binary is guessed from the output when not given)."""
    texts, i1, i2 = data.unique_texts()
    X = encoder.encode(texts)
    if binary is None:
        vals = X.data if hasattr(X, "data") and not isinstance(X, np.ndarray) else np.asarray(X)
        binary = bool(np.isin(np.unique(vals), (0, 1)).all())
    return sts_scores(X, data, i1, i2, binary)


def evaluate_retrieval(encoder: Any, data: RetrievalData, k: int = 10) -> float:
    """Library helper: nDCG@k x100 of any Encoder on a BEIR set."""
    return retrieval_score(encoder.encode(data.queries), encoder.encode(data.docs), data, k)


def evaluate_clustering(encoder: Any, data: ClusteringData) -> float:
    """Library helper: V-measure x100 of any Encoder on a clustering set."""
    return kmeans_v_measure(encoder.encode(data.texts), data.labels)


# ----------------------------------------------------------------------------------------- every method, one dataset


@dataclass
class Scored:
    """One method on one dataset: its scores (keys of ``results["scores"]``), seconds, STS probabilities, for an
    interpretable model on retrieval or clustering the budget sweep's scores ({rule: [score per k]}), and why a score
    is undefined ({key: reason} where it is NaN, e.g. ``{"sts": "one pair"}``)."""

    scores: dict[str, float]
    seconds: float
    sts_probs: StsProbs | None = None
    sweep: dict[str, list[float]] | None = None
    na: dict[str, str] | None = None


def score_sts(d: StsData, methods: list[Method], curves: Curves | None = None) -> dict[str, Scored]:
    """STS sets are small and their sweeps need the probabilities: they are kept (``Scored.sts_probs``)."""
    texts, i1, i2 = d.unique_texts()
    binary = {m.name: m.binary for m in methods}
    out = {}
    for name, (X, probs, secs) in embed_texts(methods, texts).items():
        res = sts_scores(X, d, i1, i2, binary[name])
        scores = {"sts": res["spearman"], **({"cognitive_load": res["cognitive_load"]} if "cognitive_load" in res else {})}
        why = sts_na_reason(X[i1], X[i2], d.scores) if np.isnan(res["spearman"]) else None
        out[name] = Scored(scores, secs, None if probs is None else StsProbs(d.name, probs, i1, i2, d.scores),
                           na={"sts": why} if why else None)
    return out


def _batches(texts: list[str], size: int):
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


def score_retrieval(d: RetrievalData, methods: list[Method], curves: Curves | None = None,
                    doc_batch: int | None = None) -> dict[str, Scored]:
    """nDCG@10 of every method, the corpus streamed ``doc_batch`` documents at a time: per method (and per budget of
    its sweep) only each query's running top 11 are kept. Seconds: encoding the queries and the corpus, plus the
    search (not the sweep)."""
    curves = curves or {}
    byname = {m.name: m for m in methods}
    queries = embed_texts(methods, d.queries)
    seconds = {name: secs for name, (_, _, secs) in queries.items()}
    tops = {name: CosineTopK(X, k=11) for name, (X, _, _) in queries.items()}  # one spare for a dropped identical id
    sweep = {name: {rule: [CosineTopK(budgeted(byname[name].obj, queries[name][1], b), k=11) for b in budgets]
                    for rule, budgets in curves.get(name, {}).items()} for name in queries if queries[name][1] is not None}
    del queries
    for batch in _batches(d.docs, doc_batch or DOC_BATCH):
        for name, (X, probs, secs) in embed_texts(methods, batch).items():
            t0 = time.time()
            tops[name].add(X)
            seconds[name] += secs + time.time() - t0
            for rule, accs in sweep.get(name, {}).items():
                for b, acc in zip(curves[name][rule], accs):
                    acc.add(budgeted(byname[name].obj, probs, b))
    out = {}
    for m in methods:
        if m.kind == "bm25":
            t0 = time.time()
            _, idx = m.obj.search(d.docs, d.queries, k=11)  # one spare for a dropped identical id
            out[m.name] = Scored({"retrieval": ranked_ndcg(idx, d, k=10)}, time.time() - t0)
            continue
        t0 = time.time()
        score = ranked_ndcg(tops[m.name].result()[1], d, k=10)
        points = {rule: [ranked_ndcg(acc.result()[1], d, k=10) for acc in accs] for rule, accs in sweep.get(m.name, {}).items()}
        out[m.name] = Scored({"retrieval": score}, seconds[m.name] + time.time() - t0, sweep=points or None)
    return out


def _stack(parts: list) -> Any:
    """One matrix of the row blocks (sparse blocks: CSR)."""
    if any(sp.issparse(p) for p in parts):
        return sp.vstack([sp.csr_matrix(p) for p in parts], format="csr")
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _dense(parts: list) -> np.ndarray:
    """The budgeted vectors, kept as sparse rows, made dense (float32) for k-means."""
    return sp.vstack(parts, format="csr").toarray().astype(np.float32, copy=False)


def score_clustering(d: ClusteringData, methods: list[Method], curves: Curves | None = None,
                     batch: int | None = None) -> dict[str, Scored]:
    """V-measure of every method; the texts embedded ``batch`` at a time, an interpretable model's budgeted vectors
    (and each sweep budget's) kept as sparse rows, made dense one set at a time for k-means (MTEB's protocol on the
    vectors as encoded)."""
    curves = curves or {}
    byname = {m.name: m for m in methods}
    parts: dict[str, list] = {}
    sweep_parts: dict[str, dict[str, list[list]]] = {}
    seconds: dict[str, float] = {}
    for texts in _batches(d.texts, batch or DOC_BATCH):
        for name, (X, probs, secs) in embed_texts(methods, texts).items():
            seconds[name] = seconds.get(name, 0.0) + secs
            if probs is None:
                parts.setdefault(name, []).append(X)
                continue
            parts.setdefault(name, []).append(sp.csr_matrix(X))
            rules = sweep_parts.setdefault(name, {rule: [[] for _ in budgets] for rule, budgets in curves.get(name, {}).items()})
            for rule, lists in rules.items():
                for b, rows in zip(curves[name][rule], lists):
                    rows.append(sp.csr_matrix(budgeted(byname[name].obj, probs, b)))
    out = {}
    for name, blocks in parts.items():
        t0 = time.time()
        score = kmeans_v_measure(_dense(blocks) if name in sweep_parts else _stack(blocks), d.labels)
        secs = seconds[name] + time.time() - t0
        points = {rule: [kmeans_v_measure(_dense(rows), d.labels) for rows in lists] for rule, lists in sweep_parts.get(name, {}).items()}
        out[name] = Scored({"clustering": score}, secs, sweep=points or None)
    return out


SCORERS: dict[str, Callable[..., dict[str, Scored]]] = {
    "sts": score_sts, "retrieval": score_retrieval, "clustering": score_clustering,
}
