"""Evaluation like the paper: STS, retrieval, clustering, cognitive load, the tau and m trade-offs.

    from cqg_ray.evaluate import evaluate_model
    results = evaluate_model("runs/demo/model", cfg.evaluate, out_dir="runs/demo/evaluation")

Modules: ``data`` (loaders), ``metrics`` (pure metrics), ``models`` (what a model must offer), ``baselines``
(dense, Bag-of-Tokens, BM25), ``methods`` (the rows), ``tasks`` (STS, retrieval, clustering: datasets and
scoring), ``sweeps`` (Figures 4 and 5), ``report`` (everything side by side), ``mteb_adapter`` (MTEB's encoder
protocol).
"""

__all__ = ["evaluate_model", "format_tables", "write_report"]


def __getattr__(name: str):
    """The report's functions, imported on first use: ``cqg-ray --help`` (which reads this package's command-line part)
    does not pay for scipy."""
    if name in __all__:
        from cqg_ray.evaluate import report

        return getattr(report, name)
    raise AttributeError(f"module 'cqg_ray.evaluate' has no attribute {name!r}")
