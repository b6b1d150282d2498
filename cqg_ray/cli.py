"""`cqg-ray <command>`: thin wrappers that parse arguments and call a stage or a tool.

Stage commands share their options: --config FILE (YAML; default: the run directory's saved
config.yaml, else the built-in defaults), --run-dir DIR, --set section.key=value (repeatable), --force.
"""

from __future__ import annotations

import argparse
import json
import sys

from cqg_ray.config import ConfigError, PipelineConfig, load_config
from cqg_ray.corpus import CorpusError
from cqg_ray.log import setup_logging
from cqg_ray.rundir import STAGES, ArtifactError, RunDir, status_table

STAGE_COMMANDS = {
    "prepare": ("prepare", "read, clean, dedup and shard the corpus (corpus.*)"),
    "encode": ("encode", "encode every document with the frozen sentence encoder (encode.*)"),
    "cluster": ("cluster", "faiss k-means, assignments and centroid neighbours (cluster.*: k)"),
    "cqg": ("questions", "contrastive question generation, probing, selection, dedup (cqg.*: n_p n_h n_e p_p p_h p_e t theta)"),
    "label": ("labels", "LLM answers for MBQA training, 20 questions per prompt (label.*)"),
    "train": ("model", "train the MBQA heads with Ray Train and save the model folder (train.*: alpha tau)"),
    "evaluate-run": ("evaluation", "evaluate the run's model (evaluate.*)"),
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config (default: RUN_DIR/config.yaml if present, else defaults)")
    p.add_argument("--run-dir", "-r", help="run directory (local path or URI); overrides the config's run_dir")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. cluster.k=50")
    p.add_argument("--force", action="store_true", help="run again even if the stage is done")


def resolve_config(args) -> PipelineConfig:
    path = args.config
    overrides = list(args.set or [])
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    if path is None and args.run_dir:
        run = RunDir(args.run_dir)
        if run.exists("config.yaml"):
            import tempfile

            with tempfile.NamedTemporaryFile("wb", suffix=".yaml", delete=False) as f:
                f.write(run.read_bytes("config.yaml"))
                path = f.name
    return load_config(path, overrides)


def cmd_stage(args) -> int:
    from cqg_ray.pipeline import init_ray, run_one

    cfg = resolve_config(args)
    init_ray(cfg.ray)
    m = run_one(cfg, STAGE_COMMANDS[args.command][0], force=args.force)
    print(json.dumps({"stage": m["stage"], "counts": m["counts"], "seconds": m["seconds"]}, indent=2))
    return 0


def cmd_run(args) -> int:
    from cqg_ray.pipeline import run_pipeline

    cfg = resolve_config(args)
    until = STAGE_COMMANDS.get(args.until, (args.until,))[0] if args.until else None
    out = run_pipeline(cfg, until=until, force=list(STAGES) if args.force else None)
    print_status(RunDir(cfg.run_dir))
    return 0 if out else 1


def print_status(run: RunDir) -> None:
    rows = status_table(run)
    cfg_hashes = {}
    if run.exists("config.yaml"):
        import yaml

        from cqg_ray.config import config_from_dict, stage_hash

        try:
            cfg = config_from_dict(yaml.safe_load(run.read_bytes("config.yaml")), run.uri("config.yaml"))
            cfg_hashes = {s: stage_hash(cfg, s) for s in STAGES}
        except ConfigError:
            pass
    print(f"run: {run.root_uri}")
    print(f"{'stage':<12} {'state':<8} {'seconds':>9}  counts")
    for r in rows:
        state, reason = r["state"], r["reason"]
        if state == "done" and cfg_hashes:
            st = run.state(r["stage"], cfg_hashes[r["stage"]])
            state, reason = st.state, st.reason
        counts = ", ".join(f"{k}={v}" for k, v in list(r["counts"].items())[:6])
        secs = f"{r['seconds']:.1f}" if r["seconds"] is not None else "-"
        print(f"{r['stage']:<12} {state:<8} {secs:>9}  {counts}{'  (' + reason + ')' if state == 'stale' else ''}")


def cmd_status(args) -> int:
    run = RunDir(args.run_dir)
    if not run.exists():
        print(f"no run directory at {args.run_dir}", file=sys.stderr)
        return 2
    print_status(run)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cqg-ray",
        description="Interpretable text embeddings (CQG-MBQA) on Ray. Stages write to a run directory and skip what is done.",
        epilog="Typical use: cqg-ray run --config demo ; cqg-ray status runs/demo",
    )
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run every stage in order (resumes; skips finished stages)")
    _common(r)
    r.add_argument("--until", help="stop after this stage (prepare, encode, cluster, cqg, label, train, evaluate-run)")
    r.set_defaults(func=cmd_run)

    for name, (_, helptext) in STAGE_COMMANDS.items():
        s = sub.add_parser(name, help=helptext, description=helptext)
        _common(s)
        s.set_defaults(func=cmd_stage)

    st = sub.add_parser("status", help="show each stage of a run: done / stale / missing, with counts and timings")
    st.add_argument("run_dir")
    st.set_defaults(func=cmd_status)

    for extra in ("cqg_ray.cqg.cli", "cqg_ray.mbqa.cli", "cqg_ray.serve.cli", "cqg_ray.evaluate.cli", "cqg_ray.plan", "cqg_ray.embed", "cqg_ray.search", "cqg_ray.export", "cqg_ray.demo"):
        try:
            mod = __import__(extra, fromlist=["add_commands"])
        except ImportError:
            continue
        if hasattr(mod, "add_commands"):
            mod.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, ArtifactError, CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
