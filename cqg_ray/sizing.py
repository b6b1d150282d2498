"""The demo's sizing to the machine, pure: the scale knobs (clusters written for, probes, negatives, labels) that fit
a time budget at this machine's measured LLM rates, within floors, and the top-up of a run that ended short of its
questions. `cqg_ray.demo` measures the rates, records the sizing in the run directory and runs the stages."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cqg_ray.config import PipelineConfig
    from cqg_ray.llm.rates import Rates

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
