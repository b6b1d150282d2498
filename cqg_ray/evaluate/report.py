"""Evaluate interpretable models side by side with the baselines, like the paper's Tables 1-4 and Figures 4-5.

    results = evaluate_model("runs/demo/model", EvaluateConfig(), out_dir="runs/demo/evaluation")
    results = evaluate_model({"CQG-MBQA": cqg_path, "QAEmb-MBQA": qaemb_path}, cfg, out_dir)

Rows are methods: every interpretable model given (binary at its tau), the first model's own dense encoder,
Bag-of-Tokens, and BM25 for retrieval; any other object with ``encode(texts)`` may be passed in the mapping as an
extra black-box row. Columns are datasets. Each interpretable model's probabilities are computed once per text
set; binary embeddings, the tau sweep and the m sweep are all thresholds / slices of them.

Written to ``out_dir`` (local path or URI): ``results.json`` (every number, NaN as null), ``report.md`` (tables,
protocol notes and plots), ``sweep_{m,tau}_<model>.png`` and ``.csv``. ``format_tables(results)`` is the short
terminal table. Evaluation runs in this process (no Ray): its cost is encoding, which the model does in batches.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.baselines import BM25, BagOfTokens, DenseEncoder
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
from cqg_ray.evaluate.metrics import (
    cognitive_load,
    l2_normalize,
    kmeans_v_measure,
    ndcg_at_k,
    ranking_from_indices,
    sts_spearman,
    top_k_cosine,
)
from cqg_ray.evaluate.models import binarize, is_interpretable, load_model, model_name, probabilities
from cqg_ray.evaluate.sweeps import StsProbs, default_m_grid, m_sweep, plot_sweep, sweep_rows, tau_sweep

log = logging.getLogger("cqg_ray")

TASK_TITLES = {
    "sts": "STS: Spearman correlation of cosine similarity (x100)",
    "retrieval": "Retrieval: nDCG@10 (x100)",
    "clustering": "Clustering: V-measure of k-means (x100)",
    "cognitive_load": "Cognitive load on STS (mean number of shared yes-dimensions, lower = easier to interpret)",
}


@dataclass
class Method:
    """One row of the tables."""

    name: str
    kind: str  # interpretable | dense | bag_of_tokens | encoder | bm25
    obj: Any
    tau: float | None = None

    @property
    def binary(self) -> bool:
        if self.kind == "bag_of_tokens":
            return self.obj.weights == "binary"  # term counts: no cognitive load (Eq. 5 is for 0/1)
        return self.kind == "interpretable"

    def describe(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "interpretable":
            d.update(tau=self.tau, dims=len(self.obj.questions))
        elif self.kind == "bag_of_tokens":
            d.update(dims=self.obj.dims, weights=self.obj.weights)
        elif self.kind == "bm25":
            d.update(self.obj.describe())
        return d


def embed_texts(methods: list[Method], texts: list[str]) -> dict[str, tuple[Any, np.ndarray | None, float]]:
    """Every method's embeddings of one text set: {name: (X, probabilities or None, seconds)}.

    Interpretable models give binary X at their tau, from probabilities computed once. The sentence encoder runs
    once per text set for everything that shares it: the dense baseline on a model's encoder and the model itself
    when it offers ``encode_embeddings`` (heads on precomputed embeddings, as ``InterpretableEmbedder`` does). The
    shared pass is timed with the first method that needs it.
    """
    raw: dict[int, np.ndarray] = {}

    def encoder_pass(enc: Any) -> np.ndarray:
        if id(enc) not in raw:
            raw[id(enc)] = DenseEncoder(enc).encode(texts)
        return raw[id(enc)]

    out = {}
    for m in methods:
        if m.kind == "bm25":
            continue
        t0 = time.time()
        probs = None
        if m.kind == "interpretable":
            if hasattr(m.obj, "encode_embeddings") and getattr(m.obj, "encoder", None) is not None:
                E = encoder_pass(m.obj.encoder)
                if getattr(m.obj, "normalize", False):
                    E = l2_normalize(E)
                probs = np.asarray(m.obj.encode_embeddings(E, binary=False), dtype=np.float32)
            else:
                probs = probabilities(m.obj, texts)
            X = binarize(probs, m.tau)
        elif m.kind == "dense":
            X = encoder_pass(m.obj.model)
        else:
            X = m.obj.encode(list(texts))
        out[m.name] = (X, probs, time.time() - t0)
    return out


# ----------------------------------------------------------------------------------------- one task, one method


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
    for task in cfg.tasks:
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


def _dataset_info(task: str, d: Any) -> dict:
    if task == "sts":
        return {"path": d.path, "pairs": len(d)}
    if task == "retrieval":
        return {"path": d.path, "queries": len(d.query_ids), "docs": len(d.docs), "full_corpus": d.full_corpus,
                "qrels": sum(len(v) for v in d.qrels.values()), "identical_ids": d.identical_ids,
                "identical_ids_dropped": d.drop_identical_ids}
    return {"path": d.path, "texts": len(d.texts), "labels": d.n_labels, "field": d.field}


# ----------------------------------------------------------------------------------------- the methods


def build_methods(
    models: dict[str, Any], baselines: list[str], tasks: list[str], bag_of_tokens_weights: str = "binary"
) -> list[Method]:
    methods = []
    for name, obj in models.items():
        if is_interpretable(obj):
            methods.append(Method(name, "interpretable", obj, tau=float(obj.tau)))
        elif hasattr(obj, "encode"):
            methods.append(Method(name, "encoder", obj))
        else:
            raise TypeError(f"{name}: not a model (needs encode(texts)); got {type(obj).__name__}")
    primary = next((m.obj for m in methods if m.kind == "interpretable"), None)
    if "dense" in baselines:
        enc = getattr(primary, "encoder", None)
        if enc is None:
            log.warning("dense baseline skipped: no interpretable model with an .encoder")
        else:
            label = getattr(primary, "encoder_name", None)
            label = str(label).split(":")[-1].rstrip("/").rsplit("/", 1)[-1] if label else None
            methods.append(Method(f"Dense ({label})" if label else "Dense encoder", "dense", DenseEncoder(enc)))
    if "bag_of_tokens" in baselines:
        methods.append(Method("Bag-of-Tokens", "bag_of_tokens", BagOfTokens(weights=bag_of_tokens_weights)))
    if "bm25" in baselines and "retrieval" in tasks:
        methods.append(Method("BM25", "bm25", BM25()))
    return methods


def _as_models(model_or_path: Any) -> dict[str, Any]:
    if isinstance(model_or_path, dict):
        return {name: load_model(m) for name, m in model_or_path.items()}
    model = load_model(model_or_path)
    return {model_name(model): model}


# ----------------------------------------------------------------------------------------- the whole evaluation


def evaluate_model(
    model_or_path: Any,
    cfg: EvaluateConfig | None = None,
    out_dir: str | None = None,
    *,
    data_root: str | None = None,
    max_queries: int | None = None,
    clustering_field: str = "text",
    seed: int = 0,
    print_table: bool = True,
) -> dict:
    """Run every configured task for the model(s) and the baselines; write the report; return all numbers.

    ``model_or_path``: an interpretable model, a model folder, or a mapping {row name: model or folder or Encoder}.
    ``cfg``: tasks, dataset paths (empty = the standard sets under ``data_root``), ``max_pairs`` (STS pairs per
    set), ``max_docs`` (retrieval corpus / clustering texts; a retrieval corpus keeps the relevant documents),
    baselines, ``tau_sweep`` and ``m_sweep`` (empty = about 10 points up to m); the sweeps run on the STS sets, so
    they need the ``sts`` task; ``keep_identical_ids``: retrieval sets (name or folder) that keep a retrieved document
    whose id is the query's (every other set drops it, as BEIR does). ``max_queries``: retrieval queries per set;
    ``clustering_field``: the JSONL field clustered (20 Newsgroups: ``text`` or ``subject``); ``seed``: the subset
    samples.
    Returns the dict written to results.json: scores[task][method][dataset], sweeps[model]["m"|"tau"], methods,
    datasets, seconds, config, protocol.
    """
    cfg = cfg or EvaluateConfig()
    t_start = time.time()
    models = _as_models(model_or_path)
    datasets = load_datasets(cfg, data_root, max_queries, clustering_field, seed)
    methods = build_methods(models, list(cfg.baselines), list(cfg.tasks), cfg.bag_of_tokens_weights)

    scores: dict[str, dict[str, dict[str, float]]] = {t: {} for t in [*datasets, *(["cognitive_load"] if "sts" in datasets else [])]}
    seconds: dict[str, dict[str, float]] = {m.name: {} for m in methods}
    sts_probs: dict[str, list[StsProbs]] = {m.name: [] for m in methods if m.kind == "interpretable"}

    for d in datasets.get("sts", []):
        texts, i1, i2 = d.unique_texts()
        for name, (X, probs, secs) in embed_texts(methods, texts).items():
            m = next(m for m in methods if m.name == name)
            res = sts_scores(X, d, i1, i2, m.binary)
            scores["sts"].setdefault(name, {})[d.name] = res["spearman"]
            if "cognitive_load" in res:
                scores["cognitive_load"].setdefault(name, {})[d.name] = res["cognitive_load"]
            if probs is not None:
                sts_probs[name].append(StsProbs(d.name, probs, i1, i2, d.scores))
            seconds[name][f"sts/{d.name}"] = secs
            log.info("sts %s %s: spearman %.2f (encoded in %.1fs)", d.name, name, res["spearman"], secs)

    for d in datasets.get("retrieval", []):
        queries, docs = embed_texts(methods, d.queries), embed_texts(methods, d.docs)
        for m in methods:
            t0 = time.time()
            if m.kind == "bm25":
                _, idx = m.obj.search(d.docs, d.queries, k=11)  # one spare for a dropped identical id
                score = ranked_ndcg(idx, d, k=10)
            else:
                score = retrieval_score(queries[m.name][0], docs[m.name][0], d, k=10)
                t0 -= queries[m.name][2] + docs[m.name][2]
            scores["retrieval"].setdefault(m.name, {})[d.name] = score
            seconds[m.name][f"retrieval/{d.name}"] = time.time() - t0
            log.info("retrieval %s %s: nDCG@10 %.2f (%.1fs)", d.name, m.name, score, time.time() - t0)

    for d in datasets.get("clustering", []):
        for name, (X, _, secs) in embed_texts(methods, d.texts).items():
            t0 = time.time() - secs
            score = kmeans_v_measure(X, d.labels)
            scores["clustering"].setdefault(name, {})[d.name] = score
            seconds[name][f"clustering/{d.name}"] = time.time() - t0
            log.info("clustering %s %s: V-measure %.2f (%.1fs)", d.name, name, score, time.time() - t0)

    sweeps = {}
    for name, data in sts_probs.items():
        if not data:
            continue
        model = next(m for m in methods if m.name == name)
        dims = data[0].probs.shape[1]
        ms = list(cfg.m_sweep) or default_m_grid(dims)
        sweeps[name] = {"m": m_sweep(data, model.tau, ms), "tau": tau_sweep(data, list(cfg.tau_sweep))}

    results = {
        "scores": scores,
        "sweeps": sweeps,
        "methods": {m.name: m.describe() for m in methods},
        "datasets": {t: {d.name: _dataset_info(t, d) for d in ds} for t, ds in datasets.items()},
        "seconds": {"total": time.time() - t_start, "per_method": seconds},
        "config": cfg.model_dump(mode="json"),
        "protocol": {
            "sts": "100 x Spearman(cosine(e1, e2), gold) over all pairs of each file",
            "retrieval": "100 x mean nDCG@10 (trec_eval ndcg_cut) over judged queries; exact top-10 by cosine over the corpus "
                         "(ties: earlier document first); BM25 via bm25s",
            "identical_ids": "a retrieved document whose id equals the query id is left out before scoring, as BEIR's "
                             "ignore_identical_ids (MTEB sets it per task), except in the sets of evaluate.keep_identical_ids",
            "clustering": "100 x V-measure of MiniBatchKMeans(n_clusters=#labels, batch_size=500, n_init='auto', "
                          "random_state=42, MTEB's) on the embeddings as encoded",
            "cognitive_load": "paper Eq. 5: mean over STS pairs of sum_i u_i v_i (binary embeddings only)",
            "binary": "interpretable models: y_i = 1[p_i > tau]",
            "max_queries": max_queries, "clustering_field": clustering_field, "subset_seed": seed,
        },
    }
    results = _finite(results)
    if out_dir is not None:
        write_report(results, out_dir)
    if print_table:
        print(format_tables(results))
    return results


# ----------------------------------------------------------------------------------------- tables and the report


def _finite(obj: Any) -> Any:
    """NaN / inf -> None and numpy scalars -> Python, so the JSON is strict."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def table_rows(results: dict, task: str) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """(columns, [(method, values)]) for one task; an "Avg." column when there are several datasets."""
    per = results["scores"].get(task, {})
    columns = list(results["datasets"].get("sts" if task == "cognitive_load" else task, {}))
    rows = []
    for method, vals in per.items():
        row = [vals.get(c) for c in columns]
        if len(columns) > 1:
            row.append(float(np.mean(row)) if all(v is not None for v in row) else None)
        rows.append((method, row))
    return columns + (["Avg."] if len(columns) > 1 else []), rows


def _fmt(v: float | None, task: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if task == "cognitive_load" else f"{v:.2f}"


def format_tables(results: dict) -> str:
    """The short terminal table: one block per task, methods as rows, datasets as columns."""
    blocks = []
    for task in ("sts", "retrieval", "clustering", "cognitive_load"):
        if not results["scores"].get(task):
            continue
        cols, rows = table_rows(results, task)
        width = max(len(r[0]) for r in rows) + 2
        cw = [max(len(c), 7) + 2 for c in cols]
        lines = [TASK_TITLES[task], " " * width + "".join(c.rjust(w) for c, w in zip(cols, cw))]
        for name, vals in rows:
            lines.append(name.ljust(width) + "".join(_fmt(v, task).rjust(w) for v, w in zip(vals, cw)))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "model"


def render_markdown(results: dict) -> str:
    out = ["# Evaluation report", ""]
    out.append(f"Total time {results['seconds']['total']:.0f} s. Methods:")
    for name, desc in results["methods"].items():
        out.append(f"- **{name}**: " + ", ".join(f"{k}={v}" for k, v in desc.items()))
    out.append("")
    out.append("Datasets:")
    for task, ds in results["datasets"].items():
        for name, info in ds.items():
            out.append(f"- {task} **{name}**: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    out.append("")
    for task in ("sts", "retrieval", "clustering", "cognitive_load"):
        if not results["scores"].get(task):
            continue
        cols, rows = table_rows(results, task)
        out += [f"## {TASK_TITLES[task]}", "", markdown_table(["Model", *cols], [[n, *[_fmt(v, task) for v in vals]] for n, vals in rows]), ""]
        if task == "retrieval":
            out += [_identical_ids_note(name, info) for name, info in results["datasets"]["retrieval"].items()] + [""]
    for name, sw in results["sweeps"].items():
        for kind, label in (("m", "number of questions m (Figure 4)"), ("tau", "threshold tau (Figure 5)")):
            rows = sweep_rows(sw[kind])
            header = list(rows[0])
            out += [f"## {name}: quality and cognitive load vs {label}", "",
                    f"![{name} {kind} sweep](sweep_{kind}_{slug(name)}.png)", "",
                    markdown_table(header, [[_sweep_cell(r[h]) for h in header] for r in rows]), ""]
    out += ["## Protocol", ""] + [f"- {k}: {v}" for k, v in results["protocol"].items()] + [""]
    return "\n".join(out)


def _identical_ids_note(name: str, info: dict) -> str:
    rule = "dropped from its ranking" if info["identical_ids_dropped"] else "kept (evaluate.keep_identical_ids)"
    return (f"- {name}: {info['identical_ids']} of {info['queries']} queries are also corpus documents under the same "
            f"id; such a document is {rule}.")


def _sweep_cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def write_report(results: dict, out_dir: str) -> None:
    """results.json, report.md, and one PNG + CSV per sweep, into ``out_dir`` (any filesystem)."""
    from cqg_ray.rundir import RunDir  # noqa: PLC0415

    run = RunDir(out_dir)
    run.makedirs("")
    run.write_json("results.json", results)
    for name, sw in results["sweeps"].items():
        for kind in ("m", "tau"):
            title = f"{name}: STS quality and cognitive load vs {'m' if kind == 'm' else 'tau'}"
            run.write_bytes(f"sweep_{kind}_{slug(name)}.png", plot_sweep(sw[kind], title))
            rows = sweep_rows(sw[kind])
            csv = [",".join(rows[0])] + [",".join(_sweep_cell(v) for v in r.values()) for r in rows]
            run.write_bytes(f"sweep_{kind}_{slug(name)}.csv", ("\n".join(csv) + "\n").encode())
    run.write_bytes("report.md", render_markdown(results).encode())
    log.info("evaluation report written to %s", run.uri("report.md"))
