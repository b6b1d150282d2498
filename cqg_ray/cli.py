"""`cqg-ray <command>`: thin wrappers that parse arguments and call a stage or a tool.

One command per stage of ``cqg_ray.stages``; they share their options: --config FILE (YAML; default: the run
directory's saved config.yaml, else the built-in defaults), --run-dir DIR (or --set run_dir=DIR, the same),
--set section.key=value (repeatable), --force. `cqg-ray run` runs every stage in order; it is also the `ray job submit` entrypoint
(``python -m cqg_ray.cli run --config ...``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import signal
import sys
import time
import traceback

from cqg_ray import stages
from cqg_ray.config import ConfigError, PipelineConfig, check_model_paths, load_config, override_value
from cqg_ray.corpus import CorpusError
from cqg_ray.lease import LEASE, LeaseHeld, LeaseLost, lease_lost, take_lease
from cqg_ray.log import LEVELS, setup_logging
from cqg_ray.rundir import ArtifactError, RunDir

# Modules that add their own commands (each has add_commands(subparsers)).
COMMAND_MODULES = ("cqg_ray.cqg.cli", "cqg_ray.serve.cli", "cqg_ray.evaluate.cli", "cqg_ray.plan", "cqg_ray.embed_cli",
                   "cqg_ray.search", "cqg_ray.export", "cqg_ray.demo", "cqg_ray.mbqa.cli")

# What --until and --force accept: a stage's command or its name.
STAGE_CHOICES = list(dict.fromkeys(n for s in stages.STAGES for n in (s.command, s.name)))

RUN_EPILOG = f"""\
    cqg-ray run --config demo --until cluster
    ray job submit --address http://HEAD:8265 --runtime-env jobs/runtime_env.yaml -- \\
        python -m cqg_ray.cli run --config paper --set run_dir=s3://bucket/cqg-ray/runs/paper

Stages, in order: {", ".join(stages.COMMANDS)}.
Each is skipped when its manifest in the run directory matches, so running (or submitting) the same command
again resumes where the last one stopped (`ray job stop` included).
Which Ray: --address, else RAY_ADDRESS (set by `ray job submit` for the entrypoint), else the config's ray.address
(none: a local Ray on this machine). On a cluster the run directory must be reachable from every node: an object
store URI (s3://, gs://) or a shared filesystem path. Exit status: 0 done, 1 a stage failed, 2 a bad config or
input, 3 the run directory is in use by another run (its lease), or another run took it with --break-lease while this
one ran, 130/143 interrupted or stopped.
"""

LEASE_HELP = ("take the run directory even if another live run holds its lease (that run stops at its next heartbeat); "
              "a lease whose run is gone goes stale by itself")


def _common(p: argparse.ArgumentParser, force: bool = True) -> None:
    p.add_argument("--config", "-c", help="YAML config (default: the run directory's config.yaml if present, else defaults)")
    p.add_argument("--run-dir", "-r", help="run directory (local path or URI); overrides the config's run_dir, as --set run_dir=DIR does")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable; the value read as YAML), e.g. cluster.k=50 or "
                        "'corpus.paths=[a.jsonl, b.jsonl]'")
    if force:
        p.add_argument("--force", action="store_true", help="run again even if the stage is done; what it keeps of its last run "
                       "(encode's finished work units, every finished LLM call in RUN/llm/ledger) is read, not recomputed: "
                       "delete the stage's folder to recompute it")
    p.add_argument("--break-lease", action="store_true", help=LEASE_HELP)


def named_run_dir(args) -> str | None:
    """The run directory the command line names: --run-dir, else the last --set run_dir=DIR."""
    if args.run_dir:
        return args.run_dir
    for item in reversed(args.set or []):
        key, sep, value = item.partition("=")
        if sep and key.strip() == "run_dir" and isinstance(value := override_value(value), str):
            return value
    return None


def resolve_config(args) -> PipelineConfig:
    """The config a run or stage command runs: --config, else the named run directory's saved config.yaml (--run-dir
    or --set run_dir=, alike: a resumed run keeps its own config), else the defaults; then the --set overrides."""
    path = args.config
    overrides = list(args.set or [])
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    run_dir = named_run_dir(args)
    if path is None and run_dir:
        run = RunDir(run_dir)
        if run.exists("config.yaml"):  # the run's own config, named as the run's file in any error
            from cqg_ray.artifacts import run_config_text

            try:
                path = run_config_text(run)
            except ConfigError as e:
                raise ConfigError(f"{e}; give --config") from None
    return load_config(path, overrides)


_SIGTERM_CAME: list[int] = []  # the SIGTERMs the running command was stopped by (unwinds_on_sigterm empties it)


def _on_sigterm(signum, frame):  # `ray job stop` sends SIGTERM: unwind so that ledgers flush what they hold
    _SIGTERM_CAME.append(signum)
    raise SystemExit(143)


def stop_code(e: BaseException) -> int:
    """The exit status of a command that ``e`` stopped: 143 once SIGTERM came (where it lands while ``ray.get`` waits,
    Ray turns the handler's SystemExit(143) into SystemExit(1), the status of a failed stage), else SystemExit's own
    code, else 130 (Ctrl-C)."""
    if _SIGTERM_CAME:
        return 143
    return e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130


def unwinds_on_sigterm(command):
    """A command that unwinds on SIGTERM (exit 143: its ledgers flush, its lease is given back), then restores the handler."""

    @functools.wraps(command)
    def run(args) -> int:
        _SIGTERM_CAME.clear()
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            return command(args)
        except SystemExit as e:
            if _SIGTERM_CAME and e.code != 143:  # SystemExit(1) out of ray.get
                raise SystemExit(143) from None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    return run


def check_corpus(cfg: PipelineConfig, names, forced=()) -> None:
    """The corpus files prepare is to read, where it will run (not done for this config, or forced): a path not found,
    a glob or folder with no file, or no path at all is a CorpusError (exit 2) before the lease and Ray."""
    from cqg_ray.config import stage_hash
    from cqg_ray.corpus.read import list_files

    if "prepare" not in names:
        return
    state = RunDir(cfg.run_dir).state("prepare", stage_hash(cfg, "prepare"), stages.get("prepare").reads).state
    if state != "done" or "prepare" in forced:
        list_files(cfg.corpus.paths, cfg.corpus.format)


@unwinds_on_sigterm
def cmd_stage(args) -> int:
    from cqg_ray.artifacts import require_run_or_new
    from cqg_ray.pipeline import init_ray, run_one

    cfg = resolve_config(args)
    require_run_or_new(cfg.run_dir, "--run-dir")
    stage, run = stages.get(args.stage), RunDir(cfg.run_dir)
    # a mistyped run directory, or a folder no run has written to (an empty one): its first input is said missing before
    # the lease and config.yaml are made in it (where a run holds it, the lease says so first)
    if not run.exists() or not (run.exists("config.yaml") or run.exists(LEASE)):
        for name in stage.reads:
            run.require(name)
    check_model_paths(cfg, [stage.name])  # a missing local model: said before the lease and Ray
    check_corpus(cfg, [stage.name], [stage.name] if args.force else [])
    with take_lease(cfg.run_dir, f"cqg-ray {stage.command}", args.break_lease):
        init_ray(cfg.ray)
        m = run_one(cfg, args.stage, force=args.force)
    print(json.dumps({"stage": m["stage"], "counts": m["counts"], "seconds": m["seconds"]}, indent=2))
    return 0


@unwinds_on_sigterm
def cmd_run(args) -> int:
    from cqg_ray.artifacts import require_run_or_new
    from cqg_ray.pipeline import ray_address

    cfg = resolve_config(args)
    require_run_or_new(cfg.run_dir, "--run-dir")
    until = stages.get(args.until).name if args.until else None
    force = None
    if args.force is not None:  # --force alone: every stage
        force = [f for group in args.force for f in group] or list(stages.NAMES)
        after = [f for group in args.force for f in group if until and stages.NAMES.index(stages.get(f).name) > stages.NAMES.index(until)]
        if after:
            raise ConfigError(f"--force {' '.join(after)}: after --until {args.until}, so it would not run; drop it or move --until")
    names = stages.NAMES[: stages.NAMES.index(until) + 1] if until else stages.NAMES
    check_model_paths(cfg, names)  # before the lease and Ray
    check_corpus(cfg, names, [stages.get(f).name for f in force or []])
    address = ray_address(args.address, cfg.ray.address)
    run = RunDir(cfg.run_dir)
    with take_lease(cfg.run_dir, "cqg-ray run", args.break_lease):  # LeaseHeld: main() says who holds it (exit 3)
        return _run_held(args, cfg, run, until, force, address)


def _run_held(args, cfg: PipelineConfig, run: RunDir, until: str | None, force: list[str] | None, address: str | None) -> int:
    import ray

    from cqg_ray.pipeline import init_ray, run_pipeline

    t0 = time.time()
    try:
        init_ray(cfg.ray.model_copy(update={"address": address}))
    except Exception as e:
        print(f"error: could not start or join Ray (address {address or 'local'}): {type(e).__name__}: {e}\n"
              "submit with `ray job submit`, pass --address, or set ray.address to null for a local Ray", file=sys.stderr)
        return 2
    try:
        res = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        print(f"cqg-ray pipeline: config {args.config or '(saved or default)'}, run directory {run.root_uri}", flush=True)
        print(f"Ray: {address or 'local'} ({nodes} node(s), {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs); "
              f"python {sys.executable}; stages up to {until or stages.NAMES[-1]}", flush=True)
        run_pipeline(cfg, until=until, force=force)
    except (ConfigError, ArtifactError, CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        _print_status(run)
        return 2
    except (KeyboardInterrupt, SystemExit) as e:
        if lease_lost(run.root_uri):  # another run took the directory (--break-lease): take_lease says so, main() exits 3
            raise
        code = stop_code(e)
        print(f"stopped after {time.time() - t0:.0f}s: run (or submit) the same command again to resume", file=sys.stderr)
        _print_status(run)
        return code
    except Exception as e:
        traceback.print_exc()
        failed = _first_unfinished(run)
        print(f"error: the pipeline failed{' in stage ' + failed if failed else ''}: {type(e).__name__}: {e}\n"
              "fix the cause and run the same command again: finished stages (and finished LLM calls) are kept", file=sys.stderr)
        _print_status(run)
        return 1
    print(f"pipeline finished in {time.time() - t0:.0f}s", flush=True)
    _print_status(run)
    return 0


def _first_unfinished(run: RunDir) -> str | None:
    try:
        return next((s for s in stages.NAMES if run.manifest(s) is None), None)
    except Exception:
        return None


def _print_status(run: RunDir) -> None:
    """The status table as `cqg-ray run` ends (its own lease still held: a stage it stopped in is not shown running)."""
    from cqg_ray.pipeline import run_status

    try:
        print(run_status(run, live=False), flush=True)
    except Exception as e:
        print(f"(no status table: {e})", file=sys.stderr)


def cmd_config(args) -> int:
    """`cqg-ray config`: the config a run would use, as YAML, or (--keys) every key with its value and meaning."""
    from cqg_ray.config import config_keys, dump_config

    cfg = resolve_config(args)
    if args.config is None and (run_dir := named_run_dir(args)) and not RunDir(run_dir).exists("config.yaml"):  # a mistyped run dir
        print(f"config: {run_dir} holds no config.yaml (no run there yet): {'--set over ' if args.set else ''}the defaults, as a new "
              "run there would start", file=sys.stderr)
    if args.keys is None:
        print(dump_config(cfg), end="")
        return 0
    rows = [(k, json.dumps(v), doc) for k, v, doc in config_keys(cfg) if k == args.keys or k.startswith(args.keys.rstrip(".") + ".") or not args.keys]
    if not rows:
        raise ConfigError(f"config --keys {args.keys}: no such key or section (sections: {', '.join(type(cfg).model_fields)})")
    width = min(44, max(len(k) for k, _, _ in rows))
    for key, value, doc in rows:
        print(f"{key:<{width}}  {value:<20}  {doc}".rstrip())
    return 0


def cmd_status(args) -> int:
    from cqg_ray.artifacts import not_a_run
    from cqg_ray.lease import LEASE, LOCK, current, describe, stale_reason
    from cqg_ray.pipeline import run_status
    from cqg_ray.progress import PROGRESS_FILE

    if args.run_dir and args.run_dir_flag and args.run_dir != args.run_dir_flag:
        raise ConfigError(f"status: two run directories given ({args.run_dir} and --run-dir {args.run_dir_flag}): give one")
    args.run_dir = args.run_dir or args.run_dir_flag
    if not args.run_dir:
        raise ConfigError("status: give the run directory (cqg-ray status DIR, or --run-dir DIR as the other commands take it)")
    run = RunDir(args.run_dir)
    if not run.exists():
        print(f"error: no run directory at {args.run_dir}", file=sys.stderr)
        return 2
    marks = ("config.yaml", LEASE, LOCK, PROGRESS_FILE, *stages.NAMES)  # a run just started holds only its lease
    what = not_a_run(run) or (None if any(run.exists(name) for name in marks) else "no config.yaml and no stage folder")
    if what is not None:  # a model folder too, though `cqg-ray evaluate` gave it an evaluation/ folder
        print(f"error: {args.run_dir} is not a cqg-ray run directory ({what})", file=sys.stderr)
        return 2
    print(run_status(run, every=args.all))
    lease = current(args.run_dir)
    if lease is not None:
        reason = stale_reason(lease)
        print(f"lease: {'stale (' + reason + ')' if reason else 'held'} by {describe(lease)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cqg-ray",
        description="Interpretable text embeddings (CQG-MBQA) on Ray. Stages write to a run directory and skip what is done.",
        epilog="Typical use: cqg-ray run --config demo ; cqg-ray status runs/demo",
    )
    p.add_argument("--log-level", default=None, type=str.upper, choices=LEVELS,
                   help="how much to log: DEBUG, INFO (default), WARNING or ERROR")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run every stage in order (resumes; skips finished stages); the `ray job submit` entrypoint",
                       description="Run every stage in order from one config, locally or as a Ray job. Resumes: done stages are skipped.",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(r, force=False)
    r.add_argument("--until", choices=STAGE_CHOICES, metavar="STAGE", help=f"stop after this stage ({', '.join(stages.COMMANDS)})")
    r.add_argument("--force", nargs="*", action="append", choices=STAGE_CHOICES, metavar="STAGE",
                   help="run these stages again even if done (repeatable); --force alone: every stage. Encode's finished "
                        "work units and every finished LLM call (RUN/llm/ledger) are read, not recomputed")
    r.add_argument("--address", help="Ray address to join (default: $RAY_ADDRESS, else the config's ray.address, else a local Ray)")
    r.set_defaults(func=cmd_run, resumes=True)

    for s in stages.STAGES:
        reads = f"It reads the stage{'s' if len(s.reads) > 1 else ''} {', '.join(s.reads)} of the run directory, and" if s.reads else "It"
        p_stage = sub.add_parser(s.command, help=s.help, description=s.help, epilog=(
            f"{reads} writes RUN/{s.name}/ (its manifest last); done for this config, it is skipped (--force: again). "
            "The config: --config, else the run directory's config.yaml, else the defaults; --set over it (`cqg-ray config` "
            "prints it). Exit status: 0 done, 1 the stage failed, 2 a bad config or input, 3 the run directory is in use "
            "(its lease), 130/143 interrupted or stopped (the same command resumes)."))
        _common(p_stage)
        p_stage.set_defaults(func=cmd_stage, stage=s.name, resumes=True)

    st = sub.add_parser("status", help="show each stage of a run: done / stale / missing, with counts and timings",
                        description="Show each stage of a run directory: done, stale (its config or an input changed since), "
                                    "missing, changed (its folder no longer matches its manifest), or running / interrupted "
                                    "for the stage a run is in, with its counts and timings, and who holds the directory "
                                    "(its lease). Exit status: 0, or 2 when the path is not a run directory.")
    st.add_argument("run_dir", nargs="?", help="the run directory (run_dir of the config), a local path or URI")
    st.add_argument("--run-dir", dest="run_dir_flag", metavar="DIR", help="the same, as the other commands take it")
    st.add_argument("--all", action="store_true", help="every count of each stage's manifest, not its first six (the "
                                                       "stage's headline counts, then the others)")
    st.set_defaults(func=cmd_status)

    c = sub.add_parser("config", help="print the config a run would use (--keys: every key, its value and what it means)",
                       description="Print the config a run or stage command would use here: --config, else the run "
                                   "directory's config.yaml, else the defaults, with --set over it, as YAML (a file to start "
                                   "your own from). --keys lists every key instead, with its value and what it means.")
    c.add_argument("--config", "-c", help="YAML config or a packaged config's name (default: the run directory's config.yaml, else defaults)")
    c.add_argument("--run-dir", "-r", help="a run directory whose config.yaml to read")
    c.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. cluster.k=50")
    c.add_argument("--keys", nargs="?", const="", metavar="SECTION", help="list every key (of SECTION, e.g. cluster or llm.openai), "
                   "its value and its meaning")
    c.set_defaults(func=cmd_config)

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    for command in sub.choices.values():  # after the command too (`status DIR --log-level DEBUG`), as before it
        command.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LEVELS,
                             help="how much to log (as before the command)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        setup_logging(args.log_level)  # $CQG_RAY_LOG: a bad one is a ConfigError, as a bad flag is
        return int(args.func(args) or 0)
    except (ConfigError, ArtifactError, CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (LeaseHeld, LeaseLost) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # only the commands that resume (resumes=True: run, the stages, embed, demo) say so
        print("interrupted: run the same command again to resume" if getattr(args, "resumes", False) else "interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # SIGTERM unwound a command (unwinds_on_sigterm): exit 143, saying so as Ctrl-C does
        if e.code == 143:
            print("stopped: run the same command again to resume" if getattr(args, "resumes", False) else "stopped", file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
