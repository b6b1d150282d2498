"""`cqg-ray demo`: the whole pipeline on a sample of ../shared/data with the embedded LLM, then two explanations.

Runs (or resumes) every stage of the packaged demo config (cqg_ray/configs/demo.yaml), then prints the evaluation
tables once (the evaluation stage prints them when it runs; the demo prints them when the stage was already done)
and, for two STS-B test pairs (one the annotators call near-identical, one unrelated), the questions both texts
answer yes, the ones they differ on, and the similarity: what the paper's case-study figure shows.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from cqg_ray.config import PipelineConfig, check_model_paths, load_config

if TYPE_CHECKING:
    from cqg_ray.llm.rates import Rates

DEFAULT_CONFIG = "demo"  # cqg_ray/configs/demo.yaml

# ---------------------------------------------------------------------------------------------- sizing
BUDGET_MIN = 10.0  # the demo's time after set-up, minutes (--minutes)
# the demo's own work per generation prompt: the property prompt with 6 + 36 texts at 200 characters, written by the
# bundled 1.5B (the AVX2 EPYC demo of 2026-11-26 read 26,800 prompt tokens for its 16 prompts)
PROMPT_TOKENS = 1_675
# of which the prompts' common prefix (chat template, rules, worked examples), read once per generation call
# (BatchEngine.generate and TorchEngine.generate copy it into each sequence)
SHARED_PROMPT_TOKENS = 691  # with the cluster keywords (598 without)
# the decoding steps of a generation call: its sequences decode together until the longest reply ends (replies of 91-140
# tokens in a call of 16 and 90-162 in one of 8 on an Intel AMX host, 2026-12-06; 95-140 in one of 16 on a capped Zen 4)
LONGEST_REPLY_TOKENS = 150
# a decoding step's cost for each sequence beyond the timed batch, in prompt tokens read: the same matrix products, but
# one row a sequence where a prompt's chunk has hundreds, and attention over the sequence's ~1,300 tokens of context.
# Steps of 16 sequences against 4 on short prompts (2026-12-06, Intel AMX host): torch-bfloat16 no dearer; under the
# AVX2 cap torch-float32 0.9-1.1 tokens a sequence (1.4 in a call of the demo's prompts) and llama.cpp 1.3-1.6
DECODE_TOKEN_COST = 1.5
# the writer's read rate on the demo's prompts (~1,100-1,700 tokens) as a share of the rate timed on a ~170-token one, by
# generate engine: llama.cpp read them at 78 tokens/s against 101 timed (16 prompts, `bench/generate.py --demo`, the Intel
# AMX host under the AVX2 cap, 2026-12-06) and at 95 against 123 (a Zen 5 under the cap, 2026-12-02): 0.77 both times,
# its attention's share growing with the context; torch-float32 read both at 37 tokens/s, torch-bfloat16 as timed
# with AMX. torch-bfloat16 without AMX (AVX-512-BF16 only) read them at 0.68-0.72 of the timed rate in two Zen 4 demos
# (2026-11-28, 12-01), 0.87 in `bench/generate.py --demo --prompts 16 --batch 16` on a Zen 4 (2026-12-07: 113
# tokens/s against 130) and ~0.74 in a Zen 5 demo (140 against 188, 2026-12-02)
LONG_PROMPT_READ = {"llamacpp": 0.77, "torch-bfloat16 without AMX": 0.75}
# the answerer's pairs a second on the demo's probes and on its labels, as a share of the timed pairs' (4 short texts,
# 5 questions each): a probe text is asked its cluster's ~9 candidates, a label text ~4 questions and is up to 300
# characters long. Probes ran at 1.21 and 1.07 of the timed rate, labels at 0.79 and 0.65 (two demos on an Intel AMX
# host, 2026-12-06); 1.15 and 0.75 on a Zen 5 under the AVX2 cap; ~1.3 and 0.9-1.2 on the AVX2 Zen 3
PROBE_PAIRS_SPEED, LABEL_PAIRS_SPEED = 1.1, 0.75
# the demo's work besides its LLM and the stages before the questions (whose time the sizing reads off their
# manifests): the questions stage's own encoding and selection, the model, the evaluation, the explanations and Ray's
# starts. On the AVX2 EPYC Zen 3 (2026-12-02) ~36 s: 7 s in questions, model 8.3, evaluation 13.5, 6 s after
REST_S = 40.0
MIN_QUESTIONS = 20
PROBE_LEVELS = ((10, 6, 4), (5, 3, 2), (3, 2, 1))  # (p_p, p_h, p_e): the demo's, the paper's, the fewest
# questions a cluster written for ends with, after the filters and dedup, at each probe level (the lowest seen): at
# 10/6/4 21 from 16 clusters (Zen 4, 2026-11-25) and 28 from 16 (Zen 5, 2026-12-01); at 3/2/1 12 from 6 and 40 from 16
# (AVX2 EPYC, 2026-11-27): with 3 positive probes more questions pass the own_cluster filter (yes for more than half of
# them). The paper's 5/3/2 was not measured alone: its neighbour above's. A demo that ends with fewer tops up (top_up)
QUESTIONS_PER_CLUSTER = (1.3, 1.3, 2.0)
# (n_h, n_e): hard and easy negatives a generation prompt, after the probes: the paper's 18 + 18, then fewer. A text at
# 200 characters is ~23 tokens of the prompt: at 6 + 6 the demo's prompts read 1,111 tokens each (11,109 for 10 on
# 2026-12-02), 564 fewer than PROMPT_TOKENS at 18 + 18, over 24 fewer texts
NEGATIVE_LEVELS, TEXT_TOKENS = ((18, 18), (9, 9), (6, 6)), 23
# (n_cluster, n_neighbor, n_random): texts labelled a question, last: the demo's 40, then 30 (held out 0.55 of them,
# the report part keeps ~10, over reliability's min_heldout of 5)
LABEL_LEVELS = ((20, 12, 8), (15, 9, 6))
SIZED = "demo_sizing.json"  # in the run directory: the sizing decided once, its rates and its reason
PROBE_KEYS, NEGATIVE_KEYS = ("cqg.p_p", "cqg.p_h", "cqg.p_e"), ("cqg.n_h", "cqg.n_e")
LABEL_KEYS = ("label.n_cluster", "label.n_neighbor", "label.n_random")
SIZED_KEYS = ("cqg.max_clusters", *PROBE_KEYS, *NEGATIVE_KEYS, *LABEL_KEYS)


def size_demo(cfg: PipelineConfig, rates: Rates, budget_s: float, fixed: frozenset[str] = frozenset(), spent_s: float = 0.0,
              loads_s: float = 0.0, read_speed: float = 1.0) -> tuple[dict, str]:
    """The demo's scale knobs for `budget_s` seconds at `rates`: the clusters questions are written for, the probes
    per question, the negatives a generation prompt shows and the texts labelled a question, the most that fit within
    the floor (MIN_QUESTIONS questions: the clusters that give them at a probe level's measured yield,
    floor_clusters; a run that ends with fewer is topped up, top_up): fewer clusters first, down to the floor at the
    demo's probes, then fewer probes (probes rank the questions: docs/questions.md), then fewer negatives (the writer
    reads them: most of generation's time on a slow CPU), then fewer labels a question (the heads learn from them),
    and last, at the fewest of each, clusters down to that level's own floor. Keys in `fixed` (set by the user)
    stay. `spent_s`: the budget's seconds already spent (the rates' measurement, the stages before the questions); the
    rest holds `loads_s` (the engines' loads still to come), REST_S, the clusters' prompts as the writer works through
    them (`generation_s`) and, per cluster, its probes and labels (at the level's yield of questions a cluster; at
    PROBE_PAIRS_SPEED and LABEL_PAIRS_SPEED of the timed pairs rate). `read_speed`: the writer's read rate on the demo's
    long prompts as a share of the timed one (LONG_PROMPT_READ of its engine).
    Returns ({key: value}, the reason in one line)."""
    c, lab = cfg.cqg, cfg.label
    most = c.max_clusters or cfg.cluster.k

    def levels(keys: tuple[str, ...], own: tuple[int, ...], table: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
        return [own] if fixed & set(keys) else [lv for lv in table if sum(lv) <= sum(own)] or [own]

    probe_levels = levels(PROBE_KEYS, (c.p_p, c.p_h, c.p_e), PROBE_LEVELS)
    negative_levels = levels(NEGATIVE_KEYS, (c.n_h, c.n_e), NEGATIVE_LEVELS)
    label_levels = levels(LABEL_KEYS, (lab.n_cluster, lab.n_neighbor, lab.n_random), LABEL_LEVELS)
    steps = ([(p, negative_levels[0], label_levels[0]) for p in probe_levels]
             + [(probe_levels[-1], lv, label_levels[0]) for lv in negative_levels[1:]]
             + [(probe_levels[-1], negative_levels[-1], lv) for lv in label_levels[1:]])
    fixed_s = spent_s + REST_S + loads_s
    for probes, negatives, labels in steps:
        last = (probes, negatives, labels) == steps[-1]
        least = min(most, floor_clusters(probes if last else probe_levels[0], c.t))  # below the first level's floor: last
        own_tokens = PROMPT_TOKENS - SHARED_PROMPT_TOKENS + TEXT_TOKENS * (sum(negatives) - sum(NEGATIVE_LEVELS[0]))
        kept = min(c.t, cluster_yield(probes))  # the questions a cluster ends with: those are labelled
        pairs_s = (c.questions_per_prompt * c.prompts_per_cluster * sum(probes) / PROBE_PAIRS_SPEED
                   + kept * sum(labels) / LABEL_PAIRS_SPEED) / rates.pairs

        def expected_s(n: int) -> float:
            return fixed_s + generation_s(n * c.prompts_per_cluster, own_tokens, rates, cfg.llm.llamacpp.batch_generate, read_speed) + n * pairs_s

        n = most if "cqg.max_clusters" in fixed else next((k for k in range(most, least, -1) if expected_s(k) <= budget_s), least)
        expected = expected_s(n)
        if expected <= budget_s or last:
            break
    sized = dict(zip(SIZED_KEYS, (n, *probes, *negatives, *labels)))
    fit = "fits" if expected <= budget_s else "does not fit; this is the floor"
    spent = f" ({spent_s:.0f} s of them spent before the questions)" if spent_s else ""
    long_read = f" ({read_speed:g} of it on long prompts)" if read_speed != 1 else ""
    reason = (f"{n} of {cfg.cluster.k} clusters, probes {probes[0]}/{probes[1]}/{probes[2]} a question, {negatives[0]} + "
              f"{negatives[1]} negatives a prompt, {sum(labels)} texts labelled a question: about {expected / 60:.1f} min "
              f"expected{spent}, {fit} ({budget_s / 60:g} min; writer {rates.read:.0f} prompt tokens/s read{long_read}, {rates.write:.1f} "
              f"written{f' by {rates.write_batch} sequences together' if (rates.write_batch or 1) > 1 else ''}; answerer {rates.pairs:.1f} pairs/s"
              f"{host_note(rates.host_speed)})")
    return {k: v for k, v in sized.items() if k not in fixed}, reason


def long_prompt_read(engine: str, flags: set[str] | None = None) -> float:
    """LONG_PROMPT_READ of the writer's generate engine on this CPU (``flags``: hardware.cpu_flags())."""
    if engine == "torch-bfloat16":
        from cqg_ray.hardware import cpu_flags

        if "amx_bf16" not in (cpu_flags() if flags is None else flags):
            engine = "torch-bfloat16 without AMX"
    return LONG_PROMPT_READ.get(engine, 1.0)


def host_note(host_speed: float | None) -> str:
    """A word on a host whose speed changed under the rates' measurement (`rates.host_changed`), or nothing."""
    from cqg_ray.llm.rates import host_changed

    if not host_changed(host_speed):
        return ""
    return f"; the host ran {host_speed:.2f}x as fast after the writer's timings as during them: all rates at the slower"


def generation_s(prompts: int, own_tokens: float, rates: Rates, gen_seqs: int, read_speed: float = 1.0) -> float:
    """The writer's seconds for `prompts` property prompts of `own_tokens` tokens each beside the common prefix, as the
    questions stage sends them (calls of cqg.stage.GENERATE_ROWS prompts, decoded `gen_seqs` at a time): every prompt's
    own tokens read, the common prefix read once a wave, and each wave's LONGEST_REPLY_TOKENS decoding steps. A step of b
    sequences takes the timed step (`rates.write_batch` sequences: write_batch / write seconds) and DECODE_TOKEN_COST
    tokens' reading for each sequence beyond those (on a CPU a step of a few sequences reads the weights once, and its
    cost grows with the tokens it computes). Prompt tokens are read at `read_speed` times `rates.read`."""
    from cqg_ray.cqg.stage import GENERATE_ROWS

    timed = rates.write_batch or 1
    step_s, read = timed / rates.write, rates.read * read_speed
    total = prompts * own_tokens / read
    for call in range(0, prompts, GENERATE_ROWS):
        size = min(GENERATE_ROWS, prompts - call)
        for wave in range(0, size, gen_seqs):
            b = min(gen_seqs, size - wave)
            total += SHARED_PROMPT_TOKENS / read + LONGEST_REPLY_TOKENS * (step_s + DECODE_TOKEN_COST * max(0, b - timed) / read)
    return total


def cluster_yield(probes: tuple[int, ...]) -> float:
    """Questions a cluster written for ends with at `probes`: the QUESTIONS_PER_CLUSTER of the first PROBE_LEVELS level
    with no more probes (the last level's below them all)."""
    return next((y for lv, y in zip(PROBE_LEVELS, QUESTIONS_PER_CLUSTER) if sum(lv) <= sum(probes)), QUESTIONS_PER_CLUSTER[-1])


def floor_clusters(probes: tuple[int, ...], t: int) -> int:
    """The fewest clusters that give MIN_QUESTIONS questions at `probes` (`cluster_yield`, at most t a cluster)."""
    return math.ceil(MIN_QUESTIONS / min(cluster_yield(probes), t))


def top_up(record: dict, questions: dict | None, k: int) -> dict | None:
    """`record` (a sizing) with questions written for more clusters, where the questions stage (its manifest,
    `questions`: the clusters written for, the questions kept) fell short of MIN_QUESTIONS: the clusters that give them
    at this run's own yield, at least one more, at most k. None where nothing is added: enough questions, every
    cluster written for (all k, or fewer than asked: the clustering left no more), no questions stage, or clusters the
    sizing did not choose (--set, or a run not sized)."""
    if "rates" not in record or "cqg.max_clusters" not in record["overrides"] or questions is None:
        return None
    n, q = questions["counts"]["clusters"], questions["counts"]["questions"]
    if q >= MIN_QUESTIONS or n >= k or n < record["overrides"]["cqg.max_clusters"]:
        return None
    more = min(k, max(n + 1, math.ceil(n * MIN_QUESTIONS / max(q, 1))))
    return {**record, "overrides": {**record["overrides"], "cqg.max_clusters": more},
            "topped_up": [*record.get("topped_up", []), {"clusters": n, "questions": q}],
            "reason": f"{record['reason']}; topped up to {more} clusters ({q} questions from {n}, under {MIN_QUESTIONS})"}


def short_note(record: dict, questions: dict | None, k: int, fixed: frozenset[str]) -> str | None:
    """The line said where the questions stage ended under MIN_QUESTIONS and `top_up` adds nothing: why no more
    clusters are written for (None where there are enough questions, or no questions stage)."""
    if questions is None or (q := questions["counts"]["questions"]) >= MIN_QUESTIONS:
        return None
    n = questions["counts"]["clusters"]
    if "cqg.max_clusters" in fixed:
        why = "cqg.max_clusters is set (--set), which the sizing leaves as it is"
    elif "rates" not in record:
        why = record["reason"].split(":")[0]  # not sized (--minutes 0 | the openai backend | ...): the config as it is
    else:
        why = "every cluster there is was written for"  # all k, or fewer than asked: the clustering left no more
    return f"demo sizing: {q} questions from {n} clusters, under the floor of {MIN_QUESTIONS}, and no more are written: {why}"


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
