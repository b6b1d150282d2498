"""Evaluate interpretable models side by side with the baselines, like the paper's Tables 1-4 and Figures 4-5.

    results = evaluate_model("runs/demo/model", EvaluateConfig(), out_dir="runs/demo/evaluation")
    results = evaluate_model({"CQG-MBQA": cqg_path, "QAEmb-MBQA": qaemb_path}, cfg, out_dir)

Rows are methods: every interpretable model given (its budgeted vectors, as ``encode(output='sparse')``), the first model's own dense encoder,
Bag-of-Tokens, and BM25 for retrieval; any other object with ``encode(texts)`` may be passed in the mapping as an
extra black-box row. Columns are datasets. Each interpretable model's probabilities are computed once per text
set; the budgeted vectors and the tau, m and budget sweeps are all budgets / slices of them. Retrieval corpora and
clustering sets stream: their probabilities are budgeted batch by batch and dropped, the budget sweep's retrieval and
clustering points scored on the way (``tasks``); only STS keeps probabilities, for the m and tau sweeps.

Written to ``out_dir`` (local path or URI): ``results.json`` (every number, NaN as null), ``report.md`` (tables,
protocol notes and plots), ``sweep_{m,tau}_<model>.png`` and ``.csv``, ``frontier_<model>.png`` and
``sweep_budget_<model>.csv``; results.json last (``write_report``). ``format_tables(results)`` is the short
terminal table. Evaluation runs in this process (no Ray): its cost is encoding, which the model does in batches. The rows are
``methods``, the per-task scoring ``tasks``; this module runs every task and writes the report.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
import tempfile
import time
from typing import Any

import numpy as np

from cqg_ray.config import EvaluateConfig
from cqg_ray.evaluate.methods import as_models, build_methods
from cqg_ray.evaluate.models import model_budget
from cqg_ray.evaluate.sweeps import (
    StsProbs,
    budget_curves,
    budget_sweep_sts,
    default_m_grid,
    m_sweep,
    plot_frontier,
    plot_sweep,
    sweep_rows,
    tau_sweep,
    with_average,
)
from cqg_ray.cqg.quality import format_quality
from cqg_ray.evaluate.data import missing_docs_note
from cqg_ray.evaluate.faithfulness import faithfulness, faithfulness_markdown, format_faithfulness
from cqg_ray.evaluate.markdown import markdown_table
from cqg_ray.evaluate.tasks import SCORERS, TASKS, dataset_info, load_datasets, load_faithfulness_texts

log = logging.getLogger("cqg_ray")

TASK_TITLES = {
    "sts": "STS: Spearman correlation of cosine similarity (x100)",
    "retrieval": "Retrieval: nDCG@10 (x100)",
    "clustering": "Clustering: V-measure of k-means (x100)",
    "cognitive_load": "Cognitive load on STS (mean number of shared yes-dimensions, lower = easier to interpret)",
}


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
    Returns the dict written to results.json: scores[task][method][dataset] (null where undefined, and then
    na_reasons[task][method][dataset] says why: "one pair", "all gold scores equal", "all model scores equal"),
    sweeps[model]["m"|"tau"|"budget"],
    question_quality[model] (``cqg-ray questions --quality``; None for a model not loaded from a folder),
    faithfulness[model][dataset] (with ``evaluate.tasks`` containing "faithfulness"), methods, datasets, seconds,
    config, protocol.
    """
    cfg = cfg or EvaluateConfig()
    t_start = time.time()
    models = as_models(model_or_path)
    datasets = load_datasets(cfg, data_root, max_queries, clustering_field, seed)
    faith_sets = load_faithfulness_texts(cfg, data_root) if "faithfulness" in cfg.tasks else []
    baselines = list(cfg.baselines) if datasets else []  # the faithfulness task alone has no table to put them in
    methods = build_methods(models, baselines, list(cfg.tasks), cfg.bag_of_tokens_weights)

    scores: dict[str, dict[str, dict[str, float]]] = {t: {} for t in [*datasets, *(["cognitive_load"] if "sts" in datasets else [])]}
    na_reasons: dict[str, dict[str, dict[str, str]]] = {}  # beside a null score: why it is undefined
    seconds: dict[str, dict[str, float]] = {m.name: {} for m in methods}
    sts_probs: dict[str, list[StsProbs]] = {m.name: [] for m in methods if m.kind == "interpretable"}
    task_sweeps: dict[str, list[tuple[str, Any, dict]]] = {m.name: [] for m in methods if m.kind == "interpretable"}
    ks = sorted(set(cfg.active_k))
    curves = {m.name: budget_curves(model_budget(m.obj), ks, getattr(m.obj, "mean", None) is not None)
              for m in methods if m.kind == "interpretable"} if ks else {}

    for task in TASKS:
        for d in datasets.get(task, []):
            for name, r in SCORERS[task](d, methods, curves).items():
                for key, value in r.scores.items():
                    scores[key].setdefault(name, {})[d.name] = value
                for key, why in (r.na or {}).items():
                    na_reasons.setdefault(key, {}).setdefault(name, {})[d.name] = why
                seconds[name][f"{task}/{d.name}"] = r.seconds
                if r.sts_probs is not None:
                    sts_probs[name].append(r.sts_probs)
                if r.sweep is not None:
                    task_sweeps[name].append((task, d, r.sweep))
                shown = [f"{k} {v:.2f}" if math.isfinite(v) else f"{k} {_fmt(None, k, (r.na or {}).get(k))}" for k, v in r.scores.items()]
                log.info("%s %s %s: %s (%.1fs)", task, d.name, name, ", ".join(shown), r.seconds)

    sweeps = {}
    for m in (m for m in methods if m.kind == "interpretable"):
        data, budget, mean = sts_probs[m.name], model_budget(m.obj), getattr(m.obj, "mean", None)
        sw: dict[str, Any] = {}
        if data:
            ms = list(cfg.m_sweep) or default_m_grid(data[0].probs.shape[1])
            sw.update(m=m_sweep(data, budget, ms, mean), tau=tau_sweep(data, list(cfg.tau_sweep)))
        if ks and (data or task_sweeps[m.name]):
            sw["budget"] = budget_sweep(m.obj, data, task_sweeps[m.name], curves[m.name], ks)
        if sw:
            sweeps[m.name] = sw

    interpretable = [m for m in methods if m.kind == "interpretable"]
    quality = {m.name: model_question_quality(m.obj) for m in interpretable}
    faith: dict[str, dict[str, dict]] = {}
    for d in faith_sets:
        for m in interpretable:
            ledger = f"{out_dir}/faithfulness" if out_dir is not None else tempfile.mkdtemp(prefix="cqg-faithfulness-")
            res = faith.setdefault(m.name, {})[d.name] = faithfulness(m.obj, d.texts, cfg.faithfulness, ledger, seed=seed, progress=print_table)
            if res.get("budget_sweep"):
                res["budget_sweep"]["plot"] = f"faithfulness_sweep_{slug(m.name)}_{slug(d.name)}"  # .png and .csv beside report.md
    if faith_sets:
        datasets = {**datasets, "faithfulness": faith_sets}

    results = {
        "scores": scores,
        "na_reasons": na_reasons,
        "sweeps": sweeps,
        "question_quality": quality,
        "faithfulness": faith,
        "methods": {m.name: m.describe() for m in methods},
        "datasets": {t: {d.name: dataset_info(t, d) for d in ds} for t, ds in datasets.items()},
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
            "cognitive_load": "paper Eq. 5: mean over STS pairs of the number of dimensions nonzero in both vectors (for 0/1 "
                              "vectors sum_i u_i v_i); interpretable models and binary Bag-of-Tokens only",
            "budget": "interpretable models are scored with the vectors encode(output='sparse') gives under their budget "
                      "(the active questions' values, zeros elsewhere); the budget sweep applies top-k rules at each k of "
                      "evaluate.active_k",
            "faithfulness": "a seeded sample of texts; per text at most per_text of the questions from each pool, at random: active "
                            "(shown by the budget), answered no (P(yes) at or below its threshold), cap left out (above it, not "
                            "shown); a judge LLM answers each with a plain yes/no prompt (single-pass, yes when P(yes) > 0.5); "
                            "yes_precision = its yes-rate on active questions, inactive_yes_rate = on answered-no ones, "
                            "balanced_accuracy = (yes_precision + 1 - inactive_yes_rate) / 2, cap_left_out_yes_rate apart; "
                            "old_rule_* = the same with inactive = every question not shown (estimated from the same judgements); "
                            "links: the labelling LLM answers the same pairs (agreement labeller-judge, head-labeller, budget-head)",
            "question_quality": "cqg-ray questions MODEL --quality: copy rate (a run of 6 words shared with a text of the corpus the "
                                "model was built from), words per question, cut-off share, top opening share, near-duplicate share",
            "max_queries": max_queries, "clustering_field": clustering_field, "subset_seed": seed,
        },
    }
    results = _finite(results)
    if out_dir is not None:
        write_report(results, out_dir)
    if print_table:
        print(format_tables(results))
    return results


def model_question_quality(model: Any) -> dict | None:
    """``cqg-ray questions MODEL --quality`` for a model loaded from a folder (None otherwise; on a corpus that cannot
    be read, the error instead of the figures)."""
    from cqg_ray.cqg.quality import model_quality

    path = getattr(model, "path", None)
    if not path:
        return None
    try:
        return model_quality(path, encoder=getattr(model, "encoder", None))
    except Exception as e:  # an unreadable corpus must not cost the whole evaluation
        log.warning("question quality of %s not measured: %s", path, e)
        return {"error": f"{type(e).__name__}: {e}"}


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


def _fmt(v: float | None, task: str, why: str | None = None) -> str:
    if v is None:
        return f"n/a ({why})" if why else "n/a"
    return f"{v:.1f}" if task == "cognitive_load" else f"{v:.2f}"


def table_cells(results: dict, task: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``table_rows`` as text: a null score as n/a, with its reason where ``results["na_reasons"]`` gives one."""
    cols, rows = table_rows(results, task)
    why = results.get("na_reasons", {}).get(task, {})
    return cols, [(name, [_fmt(v, task, why.get(name, {}).get(c)) for v, c in zip(vals, cols)]) for name, vals in rows]


def format_tables(results: dict) -> str:
    """The short terminal table: one block per task, methods as rows, datasets as columns."""
    blocks = []
    for task in ("sts", "retrieval", "clustering", "cognitive_load"):
        if not results["scores"].get(task):
            continue
        cols, rows = table_cells(results, task)
        width = max(len(r[0]) for r in rows) + 2
        cw = [max(len(c), 7, *(len(cells[j]) for _, cells in rows)) + 2 for j, c in enumerate(cols)]
        lines = [TASK_TITLES[task], " " * width + "".join(c.rjust(w) for c, w in zip(cols, cw))]
        for name, cells in rows:
            lines.append(name.ljust(width) + "".join(cell.rjust(w) for cell, w in zip(cells, cw)))
        blocks.append("\n".join(lines))
    for name, q in results.get("question_quality", {}).items():
        if q and "error" not in q:
            blocks.append(f"Question quality of {name} (cqg-ray questions --quality)\n{format_quality(q)}")
    for name, per in results.get("faithfulness", {}).items():
        for dataset, res in per.items():
            blocks.append(format_faithfulness(f"{name} on {dataset}", res))
    return "\n\n".join(blocks)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "model"


def budget_sweep(model: Any, sts: list[StsProbs], tasks: list[tuple[str, Any, dict]], curves: dict, ks: list[int]) -> dict:
    """Per budget rule and k: STS Spearman and load, retrieval nDCG@10, clustering V-measure (x100), each per dataset
    and averaged, every point scored with exactly the vectors ``budgeted(model, probs, budget)`` gives. ``tasks``:
    (task, dataset, {rule: [score per k]}), scored while the task streamed its texts (``tasks.SCORERS`` with the
    curves); STS from its kept probabilities."""
    rules: dict[str, dict] = {rule: {} for rule in curves}
    if sts:
        for rule, r in budget_sweep_sts(sts, curves, getattr(model, "mean", None)).items():
            rules[rule]["sts"] = r
    for rule in curves:
        for task, d, points in tasks:
            rules[rule].setdefault(task, {})[d.name] = list(points[rule])
        for task in ("retrieval", "clustering"):
            if task in rules[rule]:
                rules[rule][task] = with_average(rules[rule][task])
    return {"x": "k", "values": list(ks), "rules": rules}


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
        cols, cells = table_cells(results, task)
        out += [f"## {TASK_TITLES[task]}", "", markdown_table(["Model", *cols], [[n, *row] for n, row in cells]), ""]
        if task == "retrieval":
            out += [_identical_ids_note(name, info) for name, info in results["datasets"]["retrieval"].items()]
            out += [f"- {name}: {missing_docs_note(info['qrels_docs_missing'], info['qrels_docs'])}."
                    for name, info in results["datasets"]["retrieval"].items() if info.get("qrels_docs_missing")] + [""]
    for name, sw in results["sweeps"].items():
        if "budget" in sw:
            rows = budget_rows(sw["budget"])
            header = list(rows[0])
            out += [f"## {name}: quality against load, per budget rule", "",
                    "Every point is scored with exactly the vectors the model's `encode(output=\"sparse\")` gives under that rule; "
                    "the load is the mean number of questions nonzero in both texts of an STS pair.", "",
                    f"![{name} frontier](frontier_{slug(name)}.png)", "",
                    markdown_table(header, [[_sweep_cell(r[h]) for h in header] for r in rows]), ""]
        for kind, label in (("m", "number of questions m (Figure 4)"), ("tau", "threshold tau (Figure 5)")):
            if kind not in sw:
                continue
            rows = sweep_rows(sw[kind])
            header = list(rows[0])
            out += [f"## {name}: quality and cognitive load vs {label}", "",
                    f"![{name} {kind} sweep](sweep_{kind}_{slug(name)}.png)", "",
                    markdown_table(header, [[_sweep_cell(r[h]) for h in header] for r in rows]), ""]
    out += _quality_markdown(results.get("question_quality", {}))
    out += faithfulness_markdown(results.get("faithfulness", {}))
    out += ["## Protocol", ""] + [f"- {k}: {v}" for k, v in results["protocol"].items()] + [""]
    return "\n".join(out)


QUALITY_ROWS = (("copy_rate", "copy rate (a run of 6 words shared with a corpus text)"), ("words_median", "words per question, median"),
                ("words_max", "words per question, max"), ("cut_off_share", "cut off (ends on a function word before '?')"),
                ("top_opening_share", "share of the most common opening"), ("near_duplicate_share", "near duplicates (cosine >= theta)"))


def _quality_markdown(quality: dict) -> list[str]:
    shown = {n: q for n, q in quality.items() if q}
    if not shown:
        return []
    out = ["## Question quality (`cqg-ray questions MODEL --quality`)", ""]
    rows = [[label, *[_sweep_cell(q.get(key)) if "error" not in q else "n/a" for q in shown.values()]] for key, label in QUALITY_ROWS]
    rows.append(["most common opening", *[repr(q.get("top_opening")) if "error" not in q else "n/a" for q in shown.values()]])
    out += [markdown_table(["measure", *shown], rows), ""]
    errors = [f"- {n}: not measured ({q['error']})" for n, q in shown.items() if "error" in q]
    return out + (errors + [""] if errors else [])


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


def budget_rows(sweep: dict) -> list[dict]:
    """The budget sweep as table rows: one per (rule, k), the averages of each task."""
    rows = []
    for rule, r in sweep["rules"].items():
        for j, k in enumerate(sweep["values"]):
            row: dict[str, Any] = {"rule": rule, "k": k}
            if "sts" in r:
                row["STS Avg."] = _avg(r["sts"]["spearman"])[j]
                row["load Avg."] = _avg(r["sts"]["cognitive_load"])[j]
            for task in ("retrieval", "clustering"):
                if task in r:
                    row[f"{task} Avg."] = _avg(r[task])[j]
            rows.append(row)
    return rows


def _avg(per: dict[str, list]) -> list:
    return per.get("Avg.", next(iter(per.values())))


def _write_csv(run, name: str, rows: list[dict]) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(rows[0])
    writer.writerows([_sweep_cell(v) for v in r.values()] for r in rows)
    run.write_bytes(name, out.getvalue().encode())


def write_report(results: dict, out_dir: str) -> None:
    """results.json, report.md, and one PNG + CSV per sweep, into ``out_dir`` (any filesystem), each file atomically and
    the set as one: results.json is the record, and every other file is made from it (this function rewrites them from
    a results.json read back), so the old results.json and report.md go first and results.json comes last. A folder
    with a results.json holds one evaluation's files; one without it, an interrupted write."""
    from cqg_ray.rundir import RunDir

    run = RunDir(out_dir)
    run.makedirs("")
    for name in ("results.json", "report.md"):
        run.rm(name)
    for name, sw in results["sweeps"].items():
        if "budget" in sw:
            dense = next((v for n, v in results["scores"].get("sts", {}).items() if results["methods"][n]["kind"] == "dense"), None)
            dense_scores = [x for x in (dense or {}).values() if x is not None]  # none where every STS set had one pair
            dense_avg = float(np.mean(dense_scores)) if dense_scores else None
            own = results["scores"].get("sts", {}).get(name)
            load = results["scores"].get("cognitive_load", {}).get(name)
            finite = own and load and all(v is not None for v in [*own.values(), *load.values()])  # a NaN Spearman is null
            default = (float(np.mean(list(load.values()))), float(np.mean(list(own.values())))) if finite else None
            if "sts" in next(iter(sw["budget"]["rules"].values()), {}):
                run.write_bytes(f"frontier_{slug(name)}.png", plot_frontier(sw["budget"], sw.get("tau"), dense_avg, default,
                                                                           f"{name}: STS quality against cognitive load"))
            _write_csv(run, f"sweep_budget_{slug(name)}.csv", budget_rows(sw["budget"]))
        for kind in ("m", "tau"):
            if kind not in sw:
                continue
            title = f"{name}: STS quality and cognitive load vs {'m' if kind == 'm' else 'tau'}"
            run.write_bytes(f"sweep_{kind}_{slug(name)}.png", plot_sweep(sw[kind], title))
            _write_csv(run, f"sweep_{kind}_{slug(name)}.csv", sweep_rows(sw[kind]))
    for name, per in results.get("faithfulness", {}).items():
        for dataset, res in per.items():
            if res.get("budget_sweep", {}).get("plot"):
                from cqg_ray.evaluate.faith_sweep import plot_sweep as plot_faith_sweep

                stem = res["budget_sweep"]["plot"]
                run.write_bytes(f"{stem}.png", plot_faith_sweep(res["budget_sweep"], f"{name} on {dataset}: the judge's yes-rate against load"))
                _write_csv(run, f"{stem}.csv", res["budget_sweep"]["rows"])
    run.write_bytes("report.md", render_markdown(results).encode())
    run.write_json("results.json", results)  # last: the record that the files beside it are whole
    log.info("evaluation report written to %s", run.uri("report.md"))
