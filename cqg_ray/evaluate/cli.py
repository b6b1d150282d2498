"""`cqg-ray evaluate MODEL [--tasks ...]`: evaluate a model folder side by side with the baselines.

    cqg-ray evaluate runs/demo/model                                   # standard sets under ../shared/data
    cqg-ray evaluate runs/demo/model --tasks sts --sts my_pairs.tsv --max-pairs 500
    cqg-ray evaluate runs/cqg/model --compare QAEmb-MBQA=runs/qaemb/model --out reports/side-by-side
    cqg-ray evaluate cqg-minilm-ref --tasks faithfulness --texts my_texts.jsonl      # a judge LLM checks the active questions

Settings come from ``--config`` (its ``evaluate`` section) and ``--set evaluate.key=value``, then the flags.
Writes results.json, report.md and the sweep plots to ``--out`` (default MODEL/evaluation; for a shipped model's name,
evaluation/NAME in the current folder, leaving its published report alone) and prints the table.
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from cqg_ray.config import ConfigError, EvaluateConfig, check_gguf_models, check_seed, format_errors, load_config


def add_commands(sub) -> None:
    p = sub.add_parser("evaluate", help="evaluate a model: STS, retrieval, clustering, cognitive load, tau/m sweeps",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="model folder (local path or URI) or a shipped model's name")
    p.add_argument("--tasks", nargs="+", choices=["sts", "retrieval", "clustering", "faithfulness"],
                   help="default: sts retrieval clustering; faithfulness (a judge LLM answers the questions the model marks "
                        "active and inactive for sampled texts) runs when named")
    p.add_argument("--sts", nargs="+", metavar="TSV", help="STS files (sentence1, sentence2, score)")
    p.add_argument("--retrieval", nargs="+", metavar="DIR", help="BEIR folders (corpus.jsonl, queries.jsonl, qrels/test.tsv)")
    p.add_argument("--clustering", nargs="+", metavar="JSONL", help="clustering JSONL(.gz) files {text, label}")
    p.add_argument("--clustering-field", default="text", help="text field to cluster (20 Newsgroups: text or subject)")
    g = p.add_argument_group("faithfulness (docs/evaluation.md)")
    g.add_argument("--texts", nargs="+", metavar="FILE", help="texts to judge: JSONL(.gz) with a text field, or TSV (a text column, "
                   "or STS sentence1/sentence2); default STS-B test under the data root")
    g.add_argument("--n", type=int, help="texts sampled (seeded; default 100)")
    g.add_argument("--per-text", type=int, help="at most this many questions per text from each of its three pools, sampled at random: shown, "
                   "answered no, and above the threshold but left out by the budget's cap (default 5)")
    g.add_argument("--pairs", type=int, help="explained pairs shown with the judge's verdicts (default 5)")
    g.add_argument("--sweep", type=int, metavar="N", help="also estimate each budget's yes precision (top-k by p and by p - mean, several k "
                   "and floors) from N judged questions a text, and name the most faithful one with enough active questions")
    g.add_argument("--judge", metavar="MODEL", help="the judge's model on its backend (default bundled:qwen2.5-coder-1.5b on the embedded "
                   "engine); another engine: --set evaluate.faithfulness.judge.backend=openai|vllm and its settings")
    p.add_argument("--data-root", help="folder with the standard sets (layout of ../shared/data) used when no paths are given")
    p.add_argument("--max-pairs", type=int, help="STS pairs per file (random, seeded)")
    p.add_argument("--max-docs", type=int, help="retrieval corpus size (keeps the relevant documents) and clustering texts")
    p.add_argument("--max-queries", type=int, help="retrieval queries per set")
    p.add_argument("--keep-identical-ids", nargs="+", metavar="SET",
                   help="retrieval sets (report name or folder) that keep a retrieved document whose id is the query's "
                        "(default: dropped before scoring, as BEIR's ignore_identical_ids)")
    p.add_argument("--baselines", nargs="*", choices=["dense", "bag_of_tokens", "bm25"], help="default: all three")
    p.add_argument("--tau-sweep", nargs="+", type=float, metavar="TAU", help="thresholds of the tau sweep (default 0.1 ... 0.9)")
    p.add_argument("--m-sweep", nargs="+", type=int, metavar="M",
                   help="question counts of the m sweep: the first M questions (default: chosen from the model's m)")
    p.add_argument("--active-k", nargs="*", type=int, metavar="K",
                   help="budgets of the load sweep (default 8 16 32 64 96 128; the flag with no K: no sweep): per text the K most confident "
                        "questions, valued 0/1, by probability and centred (and, with the model's means, ranked by p - mean and by "
                        "p - 0.5 mean), on every task; report.md plots quality against load")
    p.add_argument("--budget", nargs="+", metavar="KEY=VALUE",
                   help="evaluate MODEL under another budget than its own, e.g. --budget rule=top_k k=64 floor=0.5 value=centred "
                        "(keys: rule tau|top_k, tau, k, floor (a number or none), value one|prob|centred, rank prob|centred|lift, lift)")
    p.add_argument("--name", help="row name of MODEL (default: the model's own name)")
    p.add_argument("--compare", nargs="+", default=[], metavar="NAME=PATH", help="more models side by side, e.g. QAEmb-MBQA=runs/qaemb/model")
    p.add_argument("--out", help="report folder (default: MODEL/evaluation; a shipped model's name: evaluation/NAME here)")
    p.add_argument("--seed", type=int, default=0, help="seed of every sample drawn (default 0)")
    p.add_argument("--config", "-c", help="YAML config whose evaluate section is the starting point")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. evaluate.max_pairs=500")
    p.set_defaults(func=cmd_evaluate)


def config_from_args(args) -> EvaluateConfig:
    cfg = load_config(args.config, args.set).evaluate
    updates = {
        "tasks": args.tasks, "sts": args.sts, "retrieval": args.retrieval, "clustering": args.clustering,
        "max_pairs": args.max_pairs, "max_docs": args.max_docs, "baselines": args.baselines,
        "tau_sweep": args.tau_sweep, "m_sweep": args.m_sweep, "keep_identical_ids": args.keep_identical_ids,
        "active_k": args.active_k,
    }
    data = {**cfg.model_dump(), **{k: v for k, v in updates.items() if v is not None}}
    faith = data["faithfulness"]
    for key, value in (("texts", args.texts), ("n", args.n), ("per_text", args.per_text), ("pairs", args.pairs), ("sweep_per_text", args.sweep)):
        if value is not None:
            faith[key] = value
    if args.judge is not None:
        backend = faith["judge"]["backend"]
        if backend == "fake":
            raise ConfigError("--judge names a model; the fake judge has none")
        faith["judge"][backend]["model"] = args.judge
    try:
        return EvaluateConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, "the evaluate options")) from None
    except ValueError as e:
        raise ConfigError(f"invalid evaluate options: {e}") from None


def check_out_folder(out: str) -> None:
    """--out on a local path that is a file, or below one: said before any work (the report's first write failed with a
    traceback once every text was encoded)."""
    from cqg_ray.artifacts import file_on_path
    from cqg_ray.rundir import RunDir

    if RunDir(out).local and (path := file_on_path(out)) is not None:
        raise ConfigError(f"--out {out}: {path} is a file; give a folder for the report (--out)")


def parse_budget(items: list[str], base):
    """A Budget from KEY=VALUE items over ``base`` (``--budget rule=top_k k=64``)."""
    changes = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--budget {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        changes[key] = value
    try:
        for key, value in changes.items():
            number = int if key == "k" else float if key in ("tau", "floor", "lift") else str
            changes[key] = None if value.lower() in ("none", "null") else number(value)
        return base.with_(**changes)
    except ValueError as e:
        raise ConfigError(f"--budget: {e}") from None


def evaluation_folder(model: str) -> str:
    """Where `cqg-ray evaluate MODEL` writes by default: MODEL/evaluation for a folder or URI; for a shipped model's
    name, evaluation/NAME here, which leaves the shipped model's own published report as it is (name its folder by
    path, models/NAME, to rewrite that)."""
    from cqg_ray.mbqa.folder import is_shipped_name

    if is_shipped_name(model):
        return f"evaluation/{model}"
    return model.rstrip("/") + "/evaluation"


def cmd_evaluate(args) -> int:
    from cqg_ray.evaluate.data import DataError
    from cqg_ray.evaluate.models import load_model, model_name
    from cqg_ray.evaluate.report import evaluate_model

    cfg = config_from_args(args)
    given = [flag for flag, value in (("--texts", args.texts), ("--n", args.n), ("--per-text", args.per_text), ("--pairs", args.pairs),
                                      ("--sweep", args.sweep), ("--judge", args.judge)) if value is not None]
    if given and "faithfulness" not in cfg.tasks:  # they were accepted and did nothing
        raise ConfigError(f"{', '.join(given)} set the faithfulness task's texts and judge: add faithfulness to --tasks "
                          f"(now {' '.join(cfg.tasks)})")
    if args.max_queries is not None and args.max_queries < 1:  # 0 scored no query (n/a), a negative one was a traceback
        raise ConfigError(f"--max-queries must be at least 1, got {args.max_queries}")
    check_seed(args.seed)
    from cqg_ray.stages import faithfulness_models

    check_gguf_models(faithfulness_models(cfg))  # a judge or labeller GGUF that cannot load: said before any text is encoded
    if args.out:  # the default (MODEL/evaluation) is checked once MODEL has loaded
        check_out_folder(args.out)
    primary = load_model(args.model)
    m = getattr(primary, "m", None)
    if cfg.m_sweep and m is not None:  # before any text is encoded
        from cqg_ray.evaluate.sweeps import usable_ms

        try:
            usable_ms(cfg.m_sweep, m)
        except ValueError as e:
            raise ConfigError(f"--m-sweep: {e}") from None
    if args.active_k and m is not None and (over := sorted({k for k in args.active_k if k > m})):
        raise ConfigError(f"--active-k {' '.join(map(str, over))}: the model has m={m} questions, so k above it shows what k={m} "
                          "shows; give k from 1 to m")
    if args.budget:
        primary.budget = parse_budget(args.budget, primary.budget)
    models = {args.name or model_name(primary): primary}
    for item in args.compare:
        name, sep, path = item.partition("=")
        if not (sep and name and path):
            raise ConfigError(f"--compare {item!r} must look like NAME=PATH")
        if name in models:  # a second row of that name replaced the first: the model evaluated was not the one named
            raise ConfigError(f"--compare {item!r}: {name!r} already names a row (MODEL's, by --name or its own name, or an "
                              "earlier --compare); give another NAME")
        models[name] = load_model(path)
    out = args.out or evaluation_folder(args.model)
    check_out_folder(out)
    try:
        evaluate_model(models, cfg, out, data_root=args.data_root, max_queries=args.max_queries,
                       clustering_field=args.clustering_field, seed=args.seed, print_table=True)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\nreport: {out}/report.md")
    return 0
