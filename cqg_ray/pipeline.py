"""Run the stages in order from one config, skipping what is done and resuming what is not.

The CLI's stage commands and ``run_pipeline`` call the same ``run_one``; a stage only knows its
inputs through the run directory.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from cqg_ray.config import PipelineConfig, RayConfig, dump_config, stage_hash
from cqg_ray.rundir import STAGES, RunDir, StageContext, run_stage

log = logging.getLogger("cqg_ray")


def init_ray(cfg: RayConfig, quiet: bool = True) -> None:
    """Start or join Ray once per process."""
    import ray

    if ray.is_initialized():
        return
    kwargs = {"include_dashboard": cfg.include_dashboard, "log_to_driver": not quiet, "configure_logging": True,
              "logging_level": logging.WARNING if quiet else logging.INFO}
    if cfg.address:
        ray.init(address=cfg.address, **kwargs)
    else:
        ray.init(num_cpus=cfg.num_cpus, **kwargs)
    import ray.data

    if quiet:  # Ray Data's per-dataset progress log lines; our own bars and logs say what is happening
        for name in ("ray.data", "ray.data._internal", "ray.train", "ray.serve"):
            logging.getLogger(name).setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = os.environ.get("CQG_RAY_PROGRESS", "1") != "0"
    ctx.print_on_execution_start = False
    try:
        ctx.enable_operator_progress_bars = False  # one overall bar is enough
    except AttributeError:
        pass


def _prepare(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.corpus import prepare

    prepare(cfg.corpus, ctx)


def _encode(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.encode import encode

    encode(cfg.encode, ctx)


def _cluster(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.cluster import cluster

    cluster(cfg.cluster, ctx)


def _questions(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.cqg.stage import run_cqg

    run_cqg(cfg, ctx)


def _labels(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.mbqa.label import run_labels

    run_labels(cfg, ctx)


def _model(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.mbqa.stage import run_train

    run_train(cfg, ctx)


def _evaluation(cfg: PipelineConfig, ctx: StageContext) -> None:
    from cqg_ray.evaluate.stage import run_evaluation

    run_evaluation(cfg, ctx)


STAGE_FUNCS: dict[str, Callable[[PipelineConfig, StageContext], None]] = {
    "prepare": _prepare,
    "encode": _encode,
    "cluster": _cluster,
    "questions": _questions,
    "labels": _labels,
    "model": _model,
    "evaluation": _evaluation,
}


def run_one(cfg: PipelineConfig, stage: str, force: bool = False) -> dict:
    """Run one stage (if not done), after saving the config into the run directory."""
    run = RunDir(cfg.run_dir)
    run.write_bytes("config.yaml", dump_config(cfg).encode())
    fn = STAGE_FUNCS[stage]
    return run_stage(run, stage, stage_hash(cfg, stage), lambda ctx: fn(cfg, ctx), STAGES[stage], force=force)


def run_pipeline(cfg: PipelineConfig, until: str | None = None, force: list[str] | None = None, skip: list[str] | None = None) -> dict[str, dict]:
    """All stages in order (up to and including ``until``); done stages are skipped."""
    init_ray(cfg.ray)
    out = {}
    for stage in STAGES:
        if skip and stage in skip:
            continue
        out[stage] = run_one(cfg, stage, force=bool(force and stage in force))
        if stage == until:
            break
    return out
