"""`cqg-ray demo`: the whole pipeline on a sample of ../shared/data with the embedded LLM, then two explanations.

Runs (or resumes) every stage of the packaged demo config (cqg_ray/configs/demo.yaml), then prints the evaluation
tables once (the evaluation stage prints them when it runs; the demo prints them when the stage was already done)
and, for two STS-B test pairs (one the annotators call near-identical, one unrelated), the questions both texts
answer yes, the ones they differ on, and the similarity: what the paper's case-study figure shows.
"""

from __future__ import annotations

import csv
import os
import sys

from cqg_ray.config import load_config

DEFAULT_CONFIG = "demo"  # cqg_ray/configs/demo.yaml


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


def run_demo(config: str | None = None, overrides: list[str] | None = None, break_lease: bool = False) -> int:
    from cqg_ray.explain import format_explanation
    from cqg_ray.lease import take_lease
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.pipeline import run_pipeline, run_status
    from cqg_ray.rundir import RunDir

    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    run = RunDir(cfg.run_dir)
    with take_lease(cfg.run_dir, "cqg-ray demo", break_lease):  # LeaseHeld: the CLI says who holds it (exit 3)
        print(f"cqg-ray demo: run directory {cfg.run_dir} (interrupt any time; the same command resumes)", flush=True)
        before = run.manifest("evaluation")
        manifests = run_pipeline(cfg)
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


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="run the embedded demo end to end (resumes) and print explanations",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--config", "-c", default=None, help="a packaged config by name or a YAML path (default: demo, i.e. cqg_ray/configs/demo.yaml)")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--break-lease", action="store_true", help="take the run directory even if another live run holds its lease")
    p.set_defaults(func=lambda a: run_demo(a.config, a.set, a.break_lease))


if __name__ == "__main__":
    sys.exit(run_demo())
