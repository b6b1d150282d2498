"""`cqg-ray demo`: the whole pipeline on a sample of ../shared/data with the embedded LLM, then two explanations.

Runs (or resumes) every stage of the packaged demo config (cqg_ray/configs/demo.yaml), then prints the evaluation
tables once (the evaluation stage prints them when it runs; the demo prints them when the stage was already done)
and, for two STS-B test pairs (one the annotators call near-identical, one unrelated), the questions both texts
answer yes, the ones they differ on, and the similarity: what the paper's case-study figure shows.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import asdict

from cqg_ray.config import PipelineConfig, check_model_paths, load_config
from cqg_ray.sizing import MIN_QUESTIONS, SIZED_KEYS, long_prompt_read, short_note, size_demo, top_up

DEFAULT_CONFIG = "demo"  # cqg_ray/configs/demo.yaml
BUDGET_MIN = 10.0  # the demo's time after set-up, minutes (--minutes)
SIZED = "demo_sizing.json"  # in the run directory: the sizing decided once (cqg_ray.sizing), its rates and its reason


def example_pairs(sts_file: str) -> list[tuple[str, str, float]]:
    """The highest- and lowest-scored pairs among the first 200 rows of an STS TSV file."""
    rows = []
    with open(sts_file, encoding="utf-8") as f:
        for i, r in enumerate(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)):
            if i >= 200:
                break
            rows.append((r["sentence1"], r["sentence2"], float(r["score"])))
    rows.sort(key=lambda r: -r[2])
    return [rows[0], rows[-1]]


def written_clusters(run, fixed: frozenset[str]) -> dict:
    """The cqg.max_clusters a run directory's questions were written with (its config.yaml), where it set one and the
    user did not: the demo config once capped it at 16, and such a run keeps its questions as they are."""
    from cqg_ray.pipeline import saved_config

    saved = saved_config(run)
    n = saved.cqg.max_clusters if saved is not None else None
    return {} if n is None or "cqg.max_clusters" in fixed else {"cqg.max_clusters": n}


def stages_before_questions() -> list[str]:
    """The pipeline's stages before the questions (prepare, encode, cluster): the demo's sizing changes none of them."""
    from cqg_ray.stages import NAMES

    return list(NAMES[: NAMES.index("questions")])


def spent_before_questions(run) -> float:
    """Seconds the stages before the questions took, as their manifests record (a stage not done: none)."""
    return sum(float((run.manifest(n) or {}).get("seconds", 0.0)) for n in stages_before_questions())


def encode_pace(run) -> float | None:
    """The encode stage's corpus bytes a unit-second in this run (`Rates.pace`), where it encoded every text now."""
    c = (run.manifest("encode") or {}).get("counts", {})
    if not c.get("unit_seconds") or c.get("encoded_now") != c.get("documents"):
        return None
    return round(c["corpus_bytes"] / c["unit_seconds"], 1)


def demo_sizing(cfg: PipelineConfig, overrides: list[str], minutes: float) -> dict:
    """The run directory's sizing, decided once (SIZED), after the stages before the questions (the sized keys change
    none of them): on a first run, the engines' rates (measured, or reused) and `size_demo` for what is left of
    `minutes` (less those stages' time and the measuring); a run directory whose questions are written keeps its
    config as it is."""
    from cqg_ray.rundir import RunDir

    run = RunDir(cfg.run_dir)
    if run.exists(SIZED):
        return read_sizing(run)
    fixed = set_keys(overrides)
    written = run.manifest("questions") is not None
    if minutes <= 0 or cfg.llm.backend != "llamacpp" or written or fixed >= set(SIZED_KEYS):
        why = ("--minutes 0" if minutes <= 0 else f"the {cfg.llm.backend} backend" if cfg.llm.backend != "llamacpp"
               else "its questions were written before" if written else "every sized key set")
        record = {"overrides": written_clusters(run, fixed) if written else {}, "reason": f"not sized ({why}): the config as it is"}
    else:
        t0 = time.perf_counter()
        from cqg_ray.cqg.stage import writer_llm
        from cqg_ray.llm.backends import keep_backend
        from cqg_ray.llm.base import resolve_engine
        from cqg_ray.llm.rates import machine_rates

        writer = writer_llm(cfg)
        rates, source = machine_rates(writer, cfg.llm, say=lambda line: print(f"demo sizing: {line}", flush=True), keep=keep_backend,
                                      answer_read=False, pace=encode_pace(run))  # the sizing does not use answer_read
        spent = spent_before_questions(run) + time.perf_counter() - t0
        # the stages answer with the demo's engines, loaded once (demo_engines): the measurement's, else loaded by the stages
        loads = 0.0 if source == "measured now" else (rates.writer_load or 0.0) + (rates.answerer_load or 0.0)
        engine = resolve_engine(writer.llamacpp.generate_engine, work="generate")
        sized, reason = size_demo(cfg, rates, minutes * 60, fixed, spent_s=spent, loads_s=loads, read_speed=long_prompt_read(engine))
        record = {"overrides": sized, "reason": reason, "rates": asdict(rates), "rates_from": source, "minutes": minutes,
                  "sizing_s": round(time.perf_counter() - t0, 1), "spent_s": round(spent, 1)}
    run.write_json(SIZED, record)
    return record


def set_keys(overrides: list[str]) -> frozenset[str]:
    """The config keys --set names (``cqg.p_e=1`` -> ``cqg.p_e``)."""
    return frozenset(o.split("=", 1)[0].strip() for o in overrides)


def read_sizing(run) -> dict:
    """The run directory's sizing (SIZED); ArtifactError, saying what to do, where it is damaged or not a sizing."""
    from cqg_ray.rundir import ArtifactError

    try:
        record = run.read_json(SIZED)
    except ArtifactError as e:
        raise ArtifactError(f"{e}: delete it, and the same command sizes the run again") from None
    if not (isinstance(record, dict) and isinstance(record.get("overrides"), dict) and isinstance(record.get("reason"), str)
            and isinstance(record.get("minutes", 0), (int, float))):
        raise ArtifactError(f"{run.uri(SIZED)} is not a demo sizing (an object with its overrides, reason and minutes): "
                            "delete it, and the same command sizes the run again")
    return record


def demo_engines(cfg: PipelineConfig) -> dict | None:
    """Keep the demo's embedded engines in this process (`backends.keep_backend`), so that each loads once and serves
    every stage that asks for it (on one machine, in place of an actor pool a stage): those the rate measurement
    loaded, else new ones that load on first use. Returns the writer's identity where it is not the answerer's (it
    can go once the questions are written); None for another backend (nothing kept)."""
    from cqg_ray.cqg.stage import writer_llm
    from cqg_ray.llm.backends import keep_backend, kept_backend
    from cqg_ray.llm.base import backend_identity
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    if cfg.llm.backend != "llamacpp":
        return None
    engines = [(llm, backend_identity(llm)) for llm in (writer_llm(cfg), cfg.llm)]
    for llm, identity in engines:
        if kept_backend(identity) is None:
            keep_backend(LlamaCppBackend(llm))  # the torch engines load on first use
    (_, w), (_, a) = engines
    return w if w != a else None


def run_demo(config: str | None = None, overrides: list[str] | None = None, break_lease: bool = False, minutes: float = BUDGET_MIN) -> int:
    from cqg_ray.artifacts import require_run_or_new
    from cqg_ray.explain import format_explanation
    from cqg_ray.llm.backends import release_backends
    from cqg_ray.lease import take_lease
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.pipeline import run_pipeline, run_status
    from cqg_ray.rundir import RunDir
    from cqg_ray.stages import NAMES

    overrides = list(overrides or [])
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    check_model_paths(cfg, NAMES)  # a missing local model: said before the lease and Ray
    run = RunDir(cfg.run_dir)
    require_run_or_new(cfg.run_dir, "--set run_dir=DIR")
    with take_lease(cfg.run_dir, "cqg-ray demo", break_lease):  # LeaseHeld: the CLI says who holds it (exit 3)
        print(f"cqg-ray demo: run directory {cfg.run_dir} (interrupt any time; the same command resumes)", flush=True)
        kept = run.exists(SIZED)
        checked: list[str] = []  # stages this process ran or found done: not run (nor logged as skipped) again
        if not kept:  # the stages before the questions first: the sizing counts their time
            run_pipeline(cfg, until=stages_before_questions()[-1])
            checked = stages_before_questions()
        sizing = demo_sizing(cfg, overrides, minutes)
        print(f"demo sizing: {sizing['reason']}" + (f" [{', '.join(f'{k}={v}' for k, v in sizing['overrides'].items())}]"
                                                     if sizing["overrides"] else ""), flush=True)
        if kept and sizing.get("minutes", minutes) != minutes:  # a resume keeps its sizing, whatever --minutes says now
            print(f"demo sizing: kept from this run directory's first demo (--minutes {sizing['minutes']:g}); --minutes {minutes:g} "
                  f"sizes a new run directory (--set run_dir=DIR)", flush=True)
        def sized(record: dict) -> PipelineConfig:  # the sizing's keys, then --set's (which win)
            return load_config(config or DEFAULT_CONFIG, [f"{k}={v}" for k, v in record["overrides"].items()] + overrides)

        cfg = sized(sizing)
        before = run.manifest("evaluation")
        writer = demo_engines(cfg)
        try:
            while True:  # the questions first: a run short of MIN_QUESTIONS writes for more clusters (top_up)
                run_pipeline(cfg, until="questions", skip=checked)
                checked = stages_before_questions()  # the sizing changes none of them
                if (more := top_up(sizing, run.manifest("questions"), cfg.cluster.k)) is None:
                    if note := short_note(sizing, run.manifest("questions"), cfg.cluster.k, set_keys(overrides)):
                        print(note, flush=True)
                    break
                n, q = more["topped_up"][-1]["clusters"], more["topped_up"][-1]["questions"]
                print(f"demo sizing: {q} questions from {n} clusters, under the floor of {MIN_QUESTIONS}: writing for "
                      f"{more['overrides']['cqg.max_clusters']} (the first {n} clusters' LLM answers are kept in the ledger)", flush=True)
                run.write_json(SIZED, more)
                sizing, cfg = more, sized(more)
            if writer is not None:
                release_backends(writer)  # its questions are written: the labels need the answerer alone
            manifests = run_pipeline(cfg, skip=[*checked, "questions"])
        finally:
            release_backends()
    # the evaluation stage prints its tables as it finishes; a stage skipped as done printed nothing (a run of it
    # writes a new manifest, so an unchanged one means it was skipped)
    evaluated_now = manifests.get("evaluation") is not None and manifests["evaluation"] != before
    print()
    print(run_status(run))
    if run.exists("evaluation", "results.json"):
        if not evaluated_now:
            from cqg_ray.evaluate.report import format_tables

            print()
            print(format_tables(run.read_json("evaluation/results.json")))
        print(f"(full report with the load frontier and the tau and m sweep plots: {run.uri('evaluation', 'report.md')})")
    model = InterpretableEmbedder.load(run.uri("model"))
    sts = cfg.evaluate.sts[0] if cfg.evaluate.sts else None
    if sts and os.path.exists(sts):
        print("\nTwo explanations (STS-B test pairs):")
        for a, b, score in example_pairs(sts):
            print(f"\n--- human similarity score {score:.1f} / 5")
            print(format_explanation(model.explain(a, b), a, b))
    print(f"\nModel folder: {run.uri('model')}  (InterpretableEmbedder.load(...))")
    return 0


DEMO_EPILOG = f"""\
The run directory is the config's run_dir: runs/demo under the current folder (--set run_dir=DIR for another).
It prints each stage's progress (CQG_RAY_PROGRESS=0: no bars or progress lines), the sizing ("demo sizing: ..."),
the run's status table, the evaluation tables, two STS-B test pairs explained by their questions, and the model folder.
Interrupted (Ctrl-C, or SIGTERM), the same command resumes: finished stages, finished LLM calls (RUN/llm/ledger/) and
the sizing (RUN/{SIZED}) are kept; the LLM rates are measured once per machine (demo-rates.json in the model cache).
Exit status: 0 done, 1 a stage failed, 2 a bad config or input, 3 the run directory is in use by another run, 130/143
interrupted or stopped.
"""


def budget_minutes(s: str) -> float:
    """An argparse type: --minutes, 0 or more (inf: no limit); NaN and a negative budget are refused, where NaN sized the
    demo to its floor and a negative one ran it unsized as '--minutes 0'."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"a time budget is 0 or more minutes (0: no sizing), got {s}")
    return v


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="run the embedded demo end to end (resumes) and print explanations",
                       description=__doc__.split("\n\n")[0], epilog=DEMO_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", default=None, help="a packaged config by name or a YAML path (default: demo, i.e. cqg_ray/configs/demo.yaml)")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable), e.g. cqg.max_clusters=8 or run_dir=runs/demo2; wins over the sizing")
    p.add_argument("--break-lease", action="store_true", help="take the run directory even if another live run holds its lease")
    p.add_argument("--minutes", type=budget_minutes, default=BUDGET_MIN,
                   help=f"time budget after set-up (default {BUDGET_MIN:g}): a new run directory measures this machine's LLM rates "
                        "(or reuses earlier ones) and sizes the clusters written for and the probes to fit, at least "
                        f"{MIN_QUESTIONS} questions (it writes for more clusters where they came out fewer); decided once per "
                        f"run directory ({SIZED}), --set keys win; 0: no sizing "
                        "(the config as it is: questions for all its clusters)")
    from cqg_ray.cli import unwinds_on_sigterm

    p.set_defaults(func=unwinds_on_sigterm(cmd_demo), resumes=True)


def cmd_demo(args) -> int:
    """`cqg-ray demo`; stopped by SIGTERM (`kill`), it says how to resume (exit 143: the ledgers flush, the lease goes)."""
    try:
        return run_demo(args.config, args.set, args.break_lease, args.minutes)
    except SystemExit as e:
        if e.code != 143:
            raise
        print("stopped: run the same command again to resume", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(run_demo())
