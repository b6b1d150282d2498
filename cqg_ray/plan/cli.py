"""`cqg-ray plan`: flags to a config, workload and throughput; the plan printed as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from cqg_ray.plan.capacity import capacity_plan
from cqg_ray.plan.format import format_plan, parse_count
from cqg_ray.plan.throughput import THROUGHPUTS, calibrate
from cqg_ray.plan.tokens import Workload

DESCRIPTION = "Capacity planner (`cqg-ray plan`): LLM requests, tokens, encoder passes and GPU hours of a run, before running it."


def _above_zero(kind: type):
    """An argparse type: a number of ``kind`` above 0 (a rate, a count, a size)."""
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a {'whole ' if kind is int else ''}number") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {s}")
        return v
    return parse


def _share(s: str) -> float:
    """An argparse type: a share in (0, 1]."""
    v = _above_zero(float)(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"a share lies in (0, 1], got {s}")
    return v


def _price(s: str) -> float:
    """An argparse type: a price in USD, 0 or more (a negative one priced the run below nothing)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"a price is 0 or more, got {s}")
    return v


MAX_COUNT = 10**12  # a trillion texts or clusters: beyond any corpus (1e30 printed 24-digit hours)


def _count_arg(s: str) -> int:
    try:
        n = parse_count(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"at most 1T (10^12), got {s}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config (default: the built-in defaults, which depart from the paper in places; "
                   "--config paper for the paper's run)")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. label.n_cluster=250")
    p.add_argument("--docs", type=_count_arg, help="corpus size N after dedup, e.g. 6.8M (default: corpus.limit)")
    p.add_argument("--clusters", "-k", type=_count_arg, help="k (default: cluster.k)")
    p.add_argument("--questions-per-cluster", type=_above_zero(int), help="questions asked per generation prompt (default: cqg.questions_per_prompt = 10)")
    p.add_argument("--dedup-survival", type=float,
                   help="share of the top-t questions that survive dedup (default: the paper's 9,614/20,000 = 0.4807; QAEmb 10,654/20,000)")
    p.add_argument("--parse-rate", type=_share, help="share of the questions asked that parse as yes/no questions (default 1.0, or "
                   "measured by --calibrate)")
    p.add_argument("--filter-survival", type=_share, help="share of the parsed questions that no filter (cqg.filters) drops before "
                   "top-t (default 1.0, or measured by --calibrate; docs/questions.md has measured figures)")
    p.add_argument("--preset", choices=sorted(THROUGHPUTS), default=None,
                   help="throughput figures: gpu (assumed H100-class) or cpu (measured on a 2-core machine); default: cpu "
                        "where the config's LLM is the embedded llama.cpp one (llm.backend: llamacpp), else gpu")
    p.add_argument("--llm-prompt-tokens-per-s", type=_above_zero(float), help="LLM prefill tokens/s per device")
    p.add_argument("--llm-completion-tokens-per-s", type=_above_zero(float), help="LLM generated tokens/s per device")
    p.add_argument("--llm-tokens-per-s", type=_above_zero(float), help="one figure for both prompt and generated tokens/s per device")
    p.add_argument("--encoder-texts-per-s", type=_above_zero(float), help="encoder texts/s per device")
    p.add_argument("--train-pairs-per-s", type=_above_zero(float), help="MBQA training (text, question) pairs/s per device")
    p.add_argument("--calibrate", metavar="RUN_DIR", help="take the throughputs from a finished (small) run on your hardware: "
                   "its encode manifest, LLM ledgers and training metrics; also shows how many of its prompts were clipped to fit")
    p.add_argument("--measure", action="store_true",
                   help="take the LLM rates from this machine's embedded engines, as the config sets them up (the writer's "
                        "reading and writing for generation, the answerer's reading for probes and labels): measured in "
                        "~20-80 s with the models' loads, or reused from an earlier measurement on this machine (the demo's); sizes a CPU build "
                        "such as --config reference --preset cpu on the machine that runs it")
    p.add_argument("--prompt-tokens-per-text", type=_above_zero(float),
                   help=f"mean tokens of a corpus text (default {Workload.prompt_tokens_per_text:g}, or measured by --calibrate: the "
                        f"mean length of its prepared texts at {Workload.chars_per_token:g} characters a token)")
    p.add_argument("--question-tokens", type=_above_zero(float), default=Workload.question_tokens, help="tokens per question (default 15)")
    p.add_argument("--answer-tokens", type=_above_zero(float), default=Workload.answer_tokens, help="tokens per answer line (default 4)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs working in parallel (wall hours = device hours / gpus)")
    p.add_argument("--cpus", type=_above_zero(int), help="CPU cores for k-means (default: 16 with the gpu preset, 2 with cpu)")
    p.add_argument("--embed-docs", type=_count_arg, help="texts in the final embedding pass (default: the corpus)")
    p.add_argument("--dim", type=_above_zero(int), help="embedding size (default: from the encoder name, else 1024)")
    p.add_argument("--simulate", action="store_true",
                   help="also run the real labelling planner on a synthetic balanced clustering "
                   "(exact packing counts; seconds to a minute, ~30 bytes per pair; k up to 16,384, texts up to 100M)")
    p.add_argument("--usd-per-m-tokens", type=_price, nargs=2, metavar=("PROMPT", "OUTPUT"),
                   help="price an LLM API: USD per million prompt and output tokens (GPT-4o-mini batch, the paper's: 0.075 0.3)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args) -> int:
    from cqg_ray.config import load_config

    cfg = load_config(args.config, args.set)
    if args.preset is None:  # the hardware the config's LLM runs on: the embedded one on this kind of machine
        args.preset = "cpu" if cfg.llm.backend == "llamacpp" else "gpu"
    tp = THROUGHPUTS[args.preset]
    if args.calibrate:
        try:
            tp = calibrate(args.calibrate, tp)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.measure:
        if cfg.llm.backend != "llamacpp":
            print(f"error: --measure measures the embedded engines (llm.backend llamacpp), not {cfg.llm.backend}", file=sys.stderr)
            return 2
        from cqg_ray.config import check_gguf_models
        from cqg_ray.cqg.stage import writer_llm
        from cqg_ray.llm.rates import machine_rates
        from cqg_ray.plan.throughput import measured

        check_gguf_models({key: value for key, value in (("llm.llamacpp.model", cfg.llm.llamacpp.model),  # before the engines load
                                                         ("cqg.writer_model", cfg.cqg.writer_model)) if value})

        rates, source = machine_rates(writer_llm(cfg), cfg.llm, say=lambda line: print(f"plan: {line}", file=sys.stderr, flush=True))
        tp = measured(rates, tp, source)
    changes = {}
    if args.llm_tokens_per_s:
        changes.update(llm_prompt_tokens_per_s=args.llm_tokens_per_s, llm_completion_tokens_per_s=args.llm_tokens_per_s)
    for name in ("llm_prompt_tokens_per_s", "llm_completion_tokens_per_s", "encoder_texts_per_s", "train_pairs_per_s"):
        if getattr(args, name):
            changes[name] = getattr(args, name)
    if changes:
        tp = replace(tp, **changes, source=tp.source + "; overridden on the command line: " + ", ".join(changes))
    if tp is THROUGHPUTS["cpu"] and cfg.llm.backend == "llamacpp" and (others := preset_strangers(cfg)):
        tp = replace(tp, source=tp.source + f"; NOT measured on this config's {', '.join(others)}: --measure times its engines "
                                            "here (about a minute), --calibrate RUN_DIR takes a pilot run's")
    shares = measured_survival(args.calibrate) if args.calibrate else {}
    texts = measured_texts(args.calibrate) if args.calibrate else {}
    if texts:
        shares["prompt_tokens_per_text"] = texts["chars"] / texts["read"] / Workload.chars_per_token
    for name in ("parse_rate", "filter_survival", "prompt_tokens_per_text"):
        if getattr(args, name) is not None:
            shares[name] = getattr(args, name)
    w = Workload(question_tokens=args.question_tokens, answer_tokens=args.answer_tokens, **shares)
    try:
        p = capacity_plan(cfg, docs=args.docs, clusters=args.clusters, questions_per_cluster=args.questions_per_cluster,
                 dedup_survival=args.dedup_survival, workload=w, throughput=tp, gpus=args.gpus, cpus=args.cpus or (2 if args.preset == "cpu" else 16),
                 embed_docs=args.embed_docs, dim=args.dim, simulate=args.simulate,
                 prices=tuple(args.usd_per_m_tokens) if args.usd_per_m_tokens else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.calibrate:
        p["measured"] = measured_clipping(args.calibrate)
        if texts:
            p["measured"]["texts"] = texts
    print(json.dumps(p, indent=2) if args.json else format_plan(p))
    return 0


def preset_strangers(cfg) -> list[str]:
    """The embedded models a config writes, probes or labels with, and the engines (as resolved on this CPU) that do the
    work, that the cpu preset's rates were not measured on (they are the bundled 0.5B's on llama.cpp)."""
    from cqg_ray.llm.base import resolve_engine

    models = {cfg.cqg.writer_model or cfg.llm.llamacpp.model, cfg.llm.llamacpp.model, cfg.label.model or cfg.llm.llamacpp.model}
    engines = {work: resolve_engine(getattr(cfg.llm.llamacpp, f"{work}_engine"), work=work) for work in ("score", "generate")}
    return (sorted(m for m in models if m != "bundled:qwen2.5-coder-0.5b")
            + [f"{engine} engine ({'scoring' if work == 'score' else 'generating'})" for work, engine in engines.items() if engine != "llamacpp"])


def measured_survival(run_dir: str) -> dict:
    """The parse rate (questions parsed / asked) and the filter survival (parsed questions no filter dropped, the
    opening cap of the selection included / parsed) a finished questions stage measured; {} without one."""
    import yaml

    from cqg_ray.config import config_from_dict
    from cqg_ray.rundir import RunDir

    run = RunDir(run_dir)
    counts = (run.manifest("questions") or {}).get("counts", {})
    if not counts.get("parsed") or not run.exists("config.yaml"):
        return {}
    c = config_from_dict(yaml.safe_load(run.read_bytes("config.yaml")) or {}, f"{run_dir}/config.yaml").cqg
    asked = counts["generation_prompts"] * c.questions_per_prompt
    dropped = sum(int(counts.get(f"dropped_{f}", 0)) for f in ("copy", "example", "long", "cut_off", "own_cluster", "opening"))
    out = {"parse_rate": min(1.0, counts["parsed"] / asked)} if asked else {}
    if c.filters and counts["parsed"] > dropped:
        out["filter_survival"] = (counts["parsed"] - dropped) / counts["parsed"]
    return out


MEASURED_TEXTS = 200_000  # the prepared texts read for their mean length (the first shards': enough for a mean)


def measured_texts(run_dir: str, limit: int = MEASURED_TEXTS) -> dict:
    """How many of a finished prepare stage's texts were read (its first ``limit``), their characters and mean length;
    {} without one."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from cqg_ray.rundir import RunDir

    run = RunDir(run_dir)
    if not run.manifest("prepare"):
        return {}
    def batches():
        for name in run.ls("prepare", suffix=".parquet"):
            with run.fs.open_input_file(run.path("prepare", name)) as f:
                yield from pq.ParquetFile(f).iter_batches(columns=["text"], batch_size=65_536)

    chars = read = 0
    for batch in batches():
        chars += pc.sum(pc.utf8_length(batch.column(0))).as_py() or 0
        read += batch.num_rows
        if read >= limit:
            break
    return {"read": read, "chars": chars, "mean_chars": round(chars / read, 1)} if read else {}


def measured_clipping(run_dir: str) -> dict:
    """What the prompt-length guard did in a finished run: prompts checked and clipped, texts dropped, characters cut,
    per LLM stage (from the questions and labels manifests)."""
    from cqg_ray.rundir import RunDir

    run, out = RunDir(run_dir), {}
    keys = ("prompts_checked", "prompts_clipped", "texts_dropped", "chars_cut")
    for stage, manifest, prefix in (("cqg-generate", "questions", "generation_"), ("cqg-probe", "questions", "probe_"), ("labels", "labels", "")):
        counts = (run.manifest(manifest) or {}).get("counts", {})
        if f"{prefix}prompts_checked" in counts:
            out[stage] = {k: int(counts.get(prefix + k, 0)) for k in keys}
    return {"run": run.root_uri, "stages": out}


def add_commands(sub) -> None:
    """`cqg-ray plan` (called by cqg_ray.cli.build_parser)."""
    p = sub.add_parser("plan", help="capacity planner: LLM requests, tokens, encoder passes and GPU hours of a run",
                       description=DESCRIPTION + " Throughput figures are assumptions unless you give yours.",
                       epilog="Example (the paper's run): cqg-ray plan --config paper --docs 6.8M --gpus 8")
    add_arguments(p)
    p.set_defaults(func=cmd_plan)
