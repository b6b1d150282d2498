"""Evaluation like the paper: STS, retrieval, clustering, cognitive load, the tau and m trade-offs.

    from cqg_ray.evaluate import evaluate_model
    results = evaluate_model("runs/demo/model", cfg.evaluate, out_dir="runs/demo/evaluation")

Modules: ``data`` (loaders), ``metrics`` (pure metrics), ``models`` (what a model must offer), ``baselines``
(dense, Bag-of-Tokens, BM25), ``methods`` (the rows), ``tasks`` (STS, retrieval, clustering: datasets and
scoring), ``sweeps`` (Figures 4 and 5), ``report`` (everything side by side), ``mteb_adapter`` (MTEB's encoder
protocol).
"""

from cqg_ray.evaluate.report import evaluate_model, format_tables, write_report

__all__ = ["evaluate_model", "format_tables", "write_report"]
