"""The pipeline's ``evaluation`` stage (`cqg-ray evaluate-run`): evaluate the run's model into ``<run>/evaluation/``."""

from __future__ import annotations

from typing import Any

import numpy as np

from cqg_ray.config import ConfigError, PipelineConfig
from cqg_ray.rundir import StageContext


def summary_counts(results: dict) -> dict[str, Any]:
    """Per task, the first (the run's) model's mean score over the datasets: what the manifest records."""
    counts: dict[str, Any] = {"methods": len(results["methods"])}
    for task, per_model in results["scores"].items():
        if not per_model:
            continue
        first = next(iter(per_model.values()))
        vals = [v for v in first.values() if v is not None]
        counts[f"{task}_avg"] = round(float(np.mean(vals)), 3) if vals else None
        counts[f"{task}_datasets"] = len(first)
    return counts


def run_evaluation(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.evaluate.data import DataError
    from cqg_ray.evaluate.report import evaluate_model
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    # the heads read embeddings made as the run's encode stage made them: the same encoder backend
    model = InterpretableEmbedder.load(ctx.run.uri("model"), backend=cfg.encode.backend)
    try:
        results = evaluate_model(model, cfg.evaluate, ctx.uri, seed=cfg.seed, print_table=True)
    except DataError as e:  # a set named in evaluate.* that cannot be read: the config's to fix (exit 2), not a stage crash
        raise ConfigError(f"the evaluation stage's data (evaluate.*): {e}") from None
    ctx.counts.update(summary_counts(results))
