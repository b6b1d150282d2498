"""Run the whole CQG-MBQA pipeline from one config file, as a Ray job (or locally).

    ray job submit --working-dir . --runtime-env jobs/runtime_env.yaml -- \\
        python jobs/pipeline.py --config paper --set run_dir=s3://bucket/cqg-ray/runs/paper

    python jobs/pipeline.py --config demo --until cluster         # same script, local Ray

Which Ray: inside `ray job submit` (RAY_ADDRESS is set for the entrypoint) or whenever RAY_ADDRESS is set, the
script joins that cluster; `--address` picks one explicitly; otherwise the config's `ray.address` (None: a local
Ray on this machine). The stages run in order (prepare, encode, cluster, cqg, label, train, evaluate-run), each
skipped when its manifest in the run directory matches, so resubmitting the same job resumes where the last one
stopped (`ray job stop` included). The run directory must be reachable from every node: an object store URI
(s3://, gs://) or a shared filesystem path. Exit status: 0 done, 1 a stage failed, 2 a bad config or input,
130/143 interrupted or stopped.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the working dir, when cqg_ray is not installed

log = logging.getLogger("cqg_ray")

# CLI names (cqg-ray run --until) and the pipeline's stage names, both accepted by --until
UNTIL_NAMES = {"prepare": "prepare", "encode": "encode", "cluster": "cluster", "cqg": "questions", "questions": "questions",
               "label": "labels", "labels": "labels", "train": "model", "model": "model", "evaluate-run": "evaluation",
               "evaluate": "evaluation", "evaluation": "evaluation"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python jobs/pipeline.py",
        description=__doc__.split("\n\n")[0] + " Resumes: done stages are skipped.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", "-c", required=True, help="a packaged config (paper, demo, reference: cqg_ray/configs/) or a YAML path")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set run_dir=s3://bucket/runs/x --set cluster.k=500")
    p.add_argument("--until", choices=sorted(UNTIL_NAMES), metavar="STAGE",
                   help="stop after this stage: prepare, encode, cluster, cqg, label, train, evaluate-run")
    p.add_argument("--force", action="append", default=[], metavar="STAGE", help="run this stage again even if it is done (repeatable)")
    p.add_argument("--address", help="Ray address to join (default: $RAY_ADDRESS, else the config's ray.address, else a local Ray)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    return p


def ray_address(cli_address: str | None, config_address: str | None) -> str | None:
    """The cluster to join: --address, else the job's RAY_ADDRESS (set by `ray job submit` for the entrypoint), else
    the config's ray.address (None = start a local Ray)."""
    if cli_address:
        return cli_address
    if os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        return os.environ.get("RAY_ADDRESS") or "auto"
    return config_address


def _on_sigterm(signum, frame):  # `ray job stop` sends SIGTERM: unwind so that ledgers flush what they hold
    raise SystemExit(143)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from cqg_ray.cli import print_status
    from cqg_ray.config import ConfigError, load_config
    from cqg_ray.corpus import CorpusError
    from cqg_ray.log import setup_logging
    from cqg_ray.rundir import STAGES, ArtifactError, RunDir

    setup_logging(args.log_level)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    until = UNTIL_NAMES[args.until] if args.until else None
    force = [UNTIL_NAMES.get(s, s) for s in args.force]
    bad = [s for s in force if s not in STAGES]
    if bad:
        print(f"error: unknown stage(s) for --force: {', '.join(bad)}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    address = ray_address(args.address, cfg.ray.address)
    cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": address})})

    import ray

    from cqg_ray.pipeline import init_ray, run_pipeline

    run = RunDir(cfg.run_dir)
    t0 = time.time()
    try:
        init_ray(cfg.ray)
    except Exception as e:  # noqa: BLE001 - no cluster at that address, a version mismatch, ...
        print(f"error: could not start or join Ray (address {address or 'local'}): {type(e).__name__}: {e}\n"
              "submit with `ray job submit`, pass --address, or set ray.address to null for a local Ray", file=sys.stderr)
        return 2
    try:
        res = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        print(f"cqg-ray pipeline: config {args.config}, run directory {run.root_uri}", flush=True)
        print(f"Ray: {address or 'local'} ({nodes} node(s), {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs); "
              f"python {sys.executable}; stages up to {until or 'evaluation'}", flush=True)
        run_pipeline(cfg, until=until, force=force or None)
    except (ConfigError, ArtifactError, CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        _status(print_status, run)
        return 2
    except (KeyboardInterrupt, SystemExit) as e:
        code = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
        print(f"stopped after {time.time() - t0:.0f}s: submit the same job again to resume", file=sys.stderr)
        _status(print_status, run)
        return code
    except Exception as e:  # noqa: BLE001 - any stage failure: say which, keep the traceback, exit non-zero
        traceback.print_exc()
        failed = _first_unfinished(run, STAGES)
        print(f"error: the pipeline failed{' in stage ' + failed if failed else ''}: {type(e).__name__}: {e}\n"
              f"fix the cause and submit the same job again: finished stages (and finished LLM calls) are kept", file=sys.stderr)
        _status(print_status, run)
        return 1
    print(f"pipeline finished in {time.time() - t0:.0f}s", flush=True)
    _status(print_status, run)
    return 0


def _first_unfinished(run, stages) -> str | None:
    try:
        return next((s for s in stages if not run.exists(s, "_manifest.json")), None)
    except Exception:  # noqa: BLE001 - the run directory itself may be the problem
        return None


def _status(print_status, run) -> None:
    try:
        print_status(run)
    except Exception as e:  # noqa: BLE001 - the status table must never hide the real error
        print(f"(no status table: {e})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
