"""The three table tasks (STS, retrieval, clustering): their datasets, and every method scored on one dataset; and
the texts of the faithfulness task (``cqg_ray.evaluate.faithfulness`` scores it).

``SCORERS[task](data, methods)`` gives each method's scores on one dataset, keyed as ``results["scores"]`` is
(STS also gives the cognitive load of binary embeddings); ``evaluate_sts`` / ``evaluate_retrieval`` /
``evaluate_clustering`` score any one Encoder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.data import (
    ClusteringData,
    DataError,
    RetrievalData,
    StsData,
    TextsData,
    default_data_root,
    default_datasets,
    load_beir,
    load_clustering,
    load_sts,
    load_texts,
)
from cqg_ray.evaluate.methods import Method, embed_texts
from cqg_ray.evaluate.metrics import cognitive_load, kmeans_v_measure, ndcg_at_k, ranking_from_indices, sts_spearman, top_k_cosine
from cqg_ray.evaluate.sweeps import StsProbs

TASKS = ("sts", "retrieval", "clustering")


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
                "identical_ids_dropped": d.drop_identical_ids}
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
    """One method on one dataset: its scores (keys of ``results["scores"]``), seconds, and STS probabilities."""

    scores: dict[str, float]
    seconds: float
    sts_probs: StsProbs | None = None
    probs: tuple[np.ndarray, ...] | None = None  # an interpretable model's probabilities (retrieval: queries, docs), for the sweeps


def score_sts(d: StsData, methods: list[Method]) -> dict[str, Scored]:
    texts, i1, i2 = d.unique_texts()
    binary = {m.name: m.binary for m in methods}
    out = {}
    for name, (X, probs, secs) in embed_texts(methods, texts).items():
        res = sts_scores(X, d, i1, i2, binary[name])
        scores = {"sts": res["spearman"], **({"cognitive_load": res["cognitive_load"]} if "cognitive_load" in res else {})}
        out[name] = Scored(scores, secs, None if probs is None else StsProbs(d.name, probs, i1, i2, d.scores))
    return out


def score_retrieval(d: RetrievalData, methods: list[Method]) -> dict[str, Scored]:
    """Seconds: encoding the queries and the corpus, plus the search."""
    queries, docs = embed_texts(methods, d.queries), embed_texts(methods, d.docs)
    out = {}
    for m in methods:
        t0 = time.time()
        if m.kind == "bm25":
            _, idx = m.obj.search(d.docs, d.queries, k=11)  # one spare for a dropped identical id
            score = ranked_ndcg(idx, d, k=10)
        else:
            score = retrieval_score(queries[m.name][0], docs[m.name][0], d, k=10)
            t0 -= queries[m.name][2] + docs[m.name][2]
        probs = (queries[m.name][1], docs[m.name][1]) if m.kind == "interpretable" else None
        out[m.name] = Scored({"retrieval": score}, time.time() - t0, probs=probs)
    return out


def score_clustering(d: ClusteringData, methods: list[Method]) -> dict[str, Scored]:
    out = {}
    for name, (X, probs, secs) in embed_texts(methods, d.texts).items():
        t0 = time.time() - secs
        score = kmeans_v_measure(X, d.labels)
        out[name] = Scored({"clustering": score}, time.time() - t0, probs=None if probs is None else (probs,))
    return out


SCORERS: dict[str, Callable[[Any, list[Method]], dict[str, Scored]]] = {
    "sts": score_sts, "retrieval": score_retrieval, "clustering": score_clustering,
}
