"""Capacity planner (`cqg-ray plan`): LLM requests, tokens, encoder passes and GPU hours of a run, before running it.

A pure function of the config (plus a few workload and throughput figures):

    p = plan(cfg, docs=6_800_000)                       # cfg: a PipelineConfig (cqg_ray/configs/paper.yaml for the paper)
    p["counts"]["questions"], p["counts"]["label_pairs"], p["stages"][i]["prompt_tokens"], p["totals"]["gpu_hours"]

How each count is derived (N texts, k clusters; paper symbols of Table 8 and Appendix C):

- CQG generation (A.1): one prompt per cluster (``cqg.max_clusters`` caps k) with n_p + n_h + n_e texts
  (QAEmb: ``qaemb_articles`` texts), asking for ``cqg.questions_per_prompt`` questions (paper: 10), so the
  candidates are k x 10 (times ``parse_rate``, the share of generated lines that parse as yes/no questions).
- Probing (Equation 1), as ``cqg_ray.cqg.stage`` does it: per cluster, p_p + p_h + p_e probe texts shared by the
  cluster's questions, one A.3 prompt per probe text with the cluster's candidates (in chunks of
  ``label.questions_per_prompt``): k x (p_p + p_h + p_e) x ceil(10 / 20) prompts.
- Selection: top t per cluster -> k x t, then dedup at theta keeps a fraction ``dedup_survival`` of them
  (default: the paper's 9,614 / 20,000 for CQG, 10,654 / 20,000 for QAEmb, Appendix E): m questions.
- Labelling (Appendix C): m x min(n_cluster + n_neighbor + n_random, N) (text, question) pairs. The paper packs
  20 questions per prompt: pairs / 20 prompts at full packing (10M pairs -> 500k prompts). Our packing
  (``cqg_ray.mbqa.plan``) groups a text's questions, so the prompts are "one per (text, 20 of its questions)"; its
  count is estimated by ``label_packing_estimate`` (derivation there) and can be checked exactly on a synthetic
  balanced clustering with ``simulate_label_packing`` (``--simulate``).
- Encoder passes: the corpus (N texts), the k x 10 candidate questions (dedup), and the final embedding pass over
  ``embed_docs`` texts (default N; the MBQA heads cost nothing beside the encoder).
- Tokens: every prompt is built with the real prompt functions (``cqg_ray.llm.prompts``) on empty slots, its
  length in characters divided by ``chars_per_token`` plus a chat-template overhead; each text adds
  ``prompt_tokens_per_text`` (capped by the stage's max_text_chars), each question ``question_tokens``; an answer
  costs ``answer_tokens`` per question ("1. yes\\n").
- Time: an LLM stage takes prompt_tokens / prompt rate + completion_tokens / completion rate device-seconds
  (prefill and decode counted one after the other: conservative for vLLM's continuous batching); an encoder pass
  texts / encoder rate; training epochs x labelled pairs x (1 - holdout) / pairs rate; k-means on the CPU, from
  its flop count (2 n k d per iteration) at the per-core rate our faiss benchmark measured. Wall hours divide
  device hours by the number of GPUs (one LLM replica / encoder actor / train worker per GPU).

Throughput presets (``THROUGHPUTS``): "gpu" holds assumed figures for one H100-class GPU (not measured here: no
GPU and no model weights on the build machine), "cpu" the figures measured on this project's 2-core machine. Every
figure can be overridden.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from decimal import Decimal, InvalidOperation

import numpy as np

from cqg_ray.config import LabelConfig, PipelineConfig

# The paper's selected -> deduplicated question counts (Appendix E): 4 questions x 5,000 clusters = 20,000 selected.
PAPER_DEDUP_SURVIVAL = {"cqg": 9_614 / 20_000, "qaemb": 10_654 / 20_000}

# Embedding sizes of known encoders (used for the k-means flop count; --dim for others).
ENCODER_DIMS = {"WhereIsAI/UAE-Large-V1": 1024, "bundled:all-MiniLM-L6-v2": 384, "sentence-transformers/all-MiniLM-L6-v2": 384}

# faiss k-means, bench/cluster.py on this 2-core machine: k=500, 100k x 384, 20 iterations in 3.2 s
# = 2 * 1e5 * 500 * 384 * 20 flop / 3.2 s / 2 cores.
KMEANS_FLOPS_PER_CORE = 2 * 100_000 * 500 * 384 * 20 / 3.2 / 2


@dataclass(frozen=True)
class Throughput:
    """Per-device processing rates (one GPU, or one 2-core machine for "cpu")."""

    llm_prompt_tokens_per_s: float
    llm_completion_tokens_per_s: float
    encoder_texts_per_s: float
    train_pairs_per_s: float
    device: str
    source: str


THROUGHPUTS = {
    "gpu": Throughput(
        llm_prompt_tokens_per_s=10_000, llm_completion_tokens_per_s=2_500, encoder_texts_per_s=1_500, train_pairs_per_s=1_000_000,
        device="GPU",
        source="ASSUMED for one H100-class GPU (not measured by this project): vLLM offline batch with a 7-8B bf16 model "
               "(prefill 10k tok/s, decode 2.5k tok/s), UAE-Large-V1 fp16 on ~128-token texts 1,500 texts/s, "
               "MBQA heads 1M pairs/s; replace them with your own measurements",
    ),
    "cpu": Throughput(
        llm_prompt_tokens_per_s=220, llm_completion_tokens_per_s=27, encoder_texts_per_s=500, train_pairs_per_s=100_000,
        device="2-core CPU machine",
        source="MEASURED on this project's 2-core machine: llama.cpp Qwen2.5-Coder-0.5B Q4_K_M with 2 threads "
               "(220 prompt tok/s, 27 generated tok/s), MiniLM-L6 through a Ray Data actor pool (500 texts/s); "
               "MBQA heads (run_epochs, 1 thread, d=384, 300 heads) 99-121k pairs/s",
    ),
}


@dataclass(frozen=True)
class Workload:
    """Token model of the prompts (assumptions; override to match your corpus and model)."""

    prompt_tokens_per_text: float = 128.0  # mean tokens of a corpus text in a prompt (before clipping)
    question_tokens: float = 15.0  # tokens of one generated question
    answer_tokens: float = 4.0  # tokens of one answer line "1. yes\n"
    chat_overhead_tokens: float = 20.0  # chat template around the user message
    chars_per_token: float = 4.0  # English text, BPE tokenizers
    single_question_overhead_tokens: float = 9.0  # single-pass, per question: "1. ", end of turn, assistant header, the reply's "1."
    single_batch: int = 64  # single-pass prompts per prefix tree (the chat template and instruction are computed once per tree)
    parse_rate: float = 1.0  # share of the requested questions that parse as yes/no questions


LLM_LEDGER_STAGES = ("cqg-generate", "cqg-probe", "qaemb-generate", "qaemb-probe", "labels")


def calibrate(run_dir: str, base: Throughput) -> Throughput:
    """Throughputs measured by a finished (small) run on the hardware you will use, in place of the preset's.

    Encoder: the encode manifest's texts/s. LLM: each ledger stage's totals give wall_s = P / R_prompt + C / R_output
    (P, C: its prompt and output tokens); generation (long outputs) and probing/labelling (short outputs) make the
    system solvable by least squares; with one stage, or a non-positive solution, one rate (P + C) / wall is used for
    both. Training: the final epoch's pairs/s. Rates describe the calibration run's whole setup (all its GPUs or
    actors): plan with --gpus relative to it."""
    from cqg_ray.rundir import RunDir

    run = RunDir(run_dir)
    if not run.exists():
        raise ValueError(f"no run directory at {run_dir}")
    changes: dict[str, float] = {}
    used = []
    enc = run.manifest("encode")
    if enc and enc.get("counts", {}).get("texts_per_s"):
        changes["encoder_texts_per_s"] = float(enc["counts"]["texts_per_s"])
        used.append(f"encode {changes['encoder_texts_per_s']:g} texts/s")
    rows = []
    for stage in LLM_LEDGER_STAGES:
        if run.exists("llm", "ledger", stage, "_stats.json"):
            t = run.read_json(f"llm/ledger/{stage}/_stats.json").get("totals", {})
            if t.get("wall_s", 0) > 0 and t.get("prompt_tokens", 0) + t.get("completion_tokens", 0) > 0:
                rows.append((float(t["prompt_tokens"]), float(t["completion_tokens"]), float(t["wall_s"]), stage))
    if rows:
        A = np.array([[r[0], r[1]] for r in rows])
        wall = np.array([r[2] for r in rows])
        inv = np.linalg.lstsq(A, wall, rcond=None)[0] if len(rows) >= 2 else np.array([-1.0, -1.0])
        if np.all(inv > 0):
            changes["llm_prompt_tokens_per_s"], changes["llm_completion_tokens_per_s"] = float(1 / inv[0]), float(1 / inv[1])
        else:
            rate = float(A.sum() / wall.sum())
            changes["llm_prompt_tokens_per_s"] = changes["llm_completion_tokens_per_s"] = rate
        used.append(f"LLM ledgers {', '.join(r[3] for r in rows)}")
    model = run.manifest("model")
    pps = ((model or {}).get("final_metrics") or {}).get("pairs_per_s")  # the stage's extra fields sit in its manifest
    if pps:
        changes["train_pairs_per_s"] = float(pps)
        used.append(f"train {pps:g} pairs/s")
    if not changes:
        raise ValueError(f"{run_dir} has no finished encode, LLM or train stage to measure throughput from")
    return replace(base, **changes, device=f"setup of {run.root_uri}",
                   source=f"MEASURED by the run {run.root_uri} ({'; '.join(used)}); the rest from the {base.device} preset")


# ------------------------------------------------------------------------------------------------ numbers


_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str | int) -> int:
    """'6.8M' -> 6800000, '10k' -> 10000, '5,000' -> 5000, '1e6' -> 1000000. A count must come out whole."""
    if isinstance(text, int):
        return text
    s = str(text).strip().replace(",", "").replace("_", "")
    suffix = s[-1:].lower() if s[-1:].isalpha() and s[-1:].lower() != "e" else ""
    if suffix and suffix not in _SUFFIX:
        raise ValueError(f"cannot read {text!r} as a count (suffixes: k, M, B)")
    try:
        value = Decimal(s[: len(s) - len(suffix)]) * _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"cannot read {text!r} as a count (examples: 6.8M, 10k, 5000)") from None
    if value != value.to_integral_value() or value < 0:
        raise ValueError(f"{text!r} is not a whole, non-negative count")
    return int(value)


def human(n: float) -> str:
    """6800000 -> '6.8M' (3 significant digits)."""
    for div, s in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{s}"
    return f"{n:.3g}" if isinstance(n, float) and n != int(n) else str(int(n))


# ------------------------------------------------------------------------------------------------ tokens


def _tokens(chars: int, w: Workload) -> float:
    return chars / w.chars_per_token


def _text_tokens(w: Workload, max_chars: int) -> float:
    return min(w.prompt_tokens_per_text, max_chars / w.chars_per_token)


def answer_prompt_tokens(n_questions: float, text_tokens: float, w: Workload) -> float:
    """Tokens of one A.3 prompt with n questions (template measured on the real prompt builder, linear in n)."""
    from cqg_ray.llm.prompts import answer_prompt

    one, two = len(answer_prompt("", [""])), len(answer_prompt("", ["", ""]))
    template_chars = one + (two - one) * (n_questions - 1)
    return w.chat_overhead_tokens + _tokens(template_chars, w) + text_tokens + n_questions * w.question_tokens


def single_pass_tokens(texts: float, pairs: float, text_tokens: float, w: Workload) -> float:
    """Prompt tokens computed by single-pass answering: each labelled text once (with its "Text Chunk" lines), each
    (text, question) pair's own line, and the chat template + instruction once per prefix tree of ``single_batch``
    prompts (a lower bound for servers whose prefix cache keeps every text while its questions are asked)."""
    from cqg_ray.llm.prompts import single_answer_prompt

    head = single_answer_prompt("", "x").split("Text Chunk:")[0]
    around_text = len("Text Chunk:\n\n\nQuestions:\n")
    return (texts * (text_tokens + _tokens(around_text, w)) + pairs * (w.question_tokens + w.single_question_overhead_tokens)
            + math.ceil(pairs / w.single_batch) * (w.chat_overhead_tokens + _tokens(len(head), w)))


def generation_prompt_tokens(cfg: PipelineConfig, w: Workload) -> tuple[float, int]:
    """(tokens of one generation prompt, texts in it) for cqg.method (A.1 or A.2)."""
    from cqg_ray.llm.prompts import cqg_prompt, qaemb_prompt

    c = cfg.cqg
    if c.method == "cqg":
        n_texts = c.n_p + c.n_h + c.n_e
        template = len(cqg_prompt([""] * c.n_p, [""] * (c.n_h + c.n_e), c.questions_per_prompt))
    else:
        n_texts = c.qaemb_articles
        template = len(qaemb_prompt([""] * n_texts, n_questions=c.questions_per_prompt))
    return w.chat_overhead_tokens + _tokens(template, w) + n_texts * _text_tokens(w, c.max_text_chars), n_texts


# ------------------------------------------------------------------------------------------------ labelling packing


def _binom_pmf(n: int, p: float) -> np.ndarray:
    return np.array([math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)])


def _poisson_pmf(lam: float, tail: float = 1e-12) -> np.ndarray:
    out, i, p = [], 0, math.exp(-lam)
    while True:
        out.append(p)
        i += 1
        p = p * lam / i
        if i > lam and p < tail:
            return np.array(out)


def _expected_prompts(pmf: np.ndarray, per_prompt: int) -> tuple[float, float]:
    """(E[ceil(Q / per_prompt)], P(Q > 0)) for Q with the given pmf."""
    q = np.arange(len(pmf))
    return float(np.sum(pmf * np.ceil(q / per_prompt))), float(1 - pmf[0])


def label_packing_estimate(n_docs: int, k: int, m: int, per_cluster: int, label: LabelConfig) -> dict:
    """Expected texts and prompts of our labelling plan (``cqg_ray.mbqa.plan.make_plan``) on a balanced clustering.

    Derivation. Clusters hold S = N/k texts. A question of cluster c takes the first a = min(n_cluster, S) texts of
    c's shared permutation, b = min(quota, J S) / J texts from the front of each of its J = neighbor_clusters
    neighbours (quota = n_neighbor plus the own-cluster shortfall) and r random texts (the rest of
    min(n_cluster + n_neighbor + n_random, N)). Questions per cluster are Binomial(per_cluster, s) with
    s = m / (k per_cluster) (each selected question survives dedup independently); with nearest-cluster lists
    treated as random, a cluster is the neighbour of D ~ Poisson(J) clusters, so the neighbour questions that read
    its front are Binomial(D per_cluster, s). A text at position p of its cluster's permutation is asked
    Q = own [p < a] + neighbour [p < b] questions and needs ceil(Q / 20) prompts; summing the expectations over
    positions and clusters gives the own/neighbour prompts and distinct texts. Random texts walk a pool of
    ceil(m r / 20) texts cyclically, so each pool text gets about 20 random questions: about m r / 20 more prompts
    (a pool text that is also a front text needs ceil((Q + 20) / 20) = ceil(Q / 20) + 1 prompts: the counts add).
    Real nearest-neighbour graphs have hubs (clusters that are everyone's neighbour): those texts exceed 20
    questions more often, so the real count can be somewhat higher.
    """
    if m == 0 or n_docs == 0:
        return {"texts": 0, "prompts": 0, "front_texts": 0, "random_pool": 0}
    qpp, J = label.questions_per_prompt, label.neighbor_clusters
    S = n_docs / k
    total = min(label.n_cluster + label.n_neighbor + label.n_random, n_docs)
    a = min(label.n_cluster, S)
    quota = label.n_neighbor + (label.n_cluster - a)
    nbr_take = min(quota, J * S, total - a)
    b = nbr_take / J
    r = total - a - nbr_take
    s = min(1.0, m / (k * per_cluster))
    own = _binom_pmf(per_cluster, s)
    nbr = np.zeros(1)
    for d, pd in enumerate(_poisson_pmf(J)):
        pmf = _binom_pmf(d * per_cluster, s)
        if len(pmf) > len(nbr):
            nbr = np.pad(nbr, (0, len(pmf) - len(nbr)))
        nbr[: len(pmf)] += pd * pmf
    both = np.convolve(own, nbr)
    p_both, t_both = _expected_prompts(both, qpp)
    p_own, t_own = _expected_prompts(own, qpp)
    p_nbr, t_nbr = _expected_prompts(nbr, qpp)
    lo, hi = min(a, b), max(a, b)
    front_prompts = k * (lo * p_both + (hi - lo) * (p_own if a > b else p_nbr))
    front_texts = k * (lo * t_both + (hi - lo) * (t_own if a > b else t_nbr))
    random_pairs = m * r
    pool = min(n_docs, max(r, math.ceil(random_pairs / qpp))) if r > 0 else 0
    if label.random_from == "labelled" and r > 0 and front_texts >= pool:
        # random pairs spread over the labelled texts: each gets R ~ Poisson(m r / front_texts) more questions
        R = _poisson_pmf(random_pairs / front_texts)

        def with_random(pmf: np.ndarray) -> float:
            labelled = pmf.copy()
            labelled[0] = 0.0  # only texts that are labelled anyway take random questions
            conv = np.convolve(labelled, R)
            return float(np.sum(conv * np.ceil(np.arange(len(conv)) / qpp)))

        own_nb = with_random(own) if a > b else with_random(nbr)
        prompts = k * (lo * with_random(both) + (hi - lo) * own_nb)
        return {"texts": int(round(front_texts)), "prompts": int(round(prompts)), "front_texts": int(round(front_texts)), "random_pool": int(round(front_texts)),
                "min_texts": int(round(k * (1 - own[0]) * a))}
    random_prompts = math.ceil(random_pairs / qpp) if r > 0 else 0
    texts = front_texts + pool * (1 - front_texts / n_docs)
    return {"texts": int(round(texts)), "prompts": int(round(front_prompts + random_prompts)),
            "front_texts": int(round(front_texts)), "random_pool": int(pool), "min_texts": int(round(k * (1 - own[0]) * a))}


def simulate_label_packing(n_docs: int, k: int, m: int, per_cluster: int, label: LabelConfig, seed: int = 0) -> dict:
    """Run the real ``make_plan`` on a synthetic balanced clustering (random neighbour lists, Binomial questions per
    cluster rescaled to exactly m): exact counts of our packing for that layout. Memory ~ 30 bytes per pair."""
    from cqg_ray.mbqa.plan import make_plan

    rng = np.random.default_rng(seed)
    assignments = rng.permutation(np.arange(n_docs) % k)
    J = max(1, min(label.neighbor_clusters, k - 1))
    neighbors = (np.arange(k)[:, None] + 1 + np.argsort(rng.random((k, k - 1)), axis=1)[:, :J]) % k  # J distinct others
    per = rng.binomial(per_cluster, min(1.0, m / (k * per_cluster)), size=k)
    while per.sum() != m:  # exactly m questions: add to / remove from random clusters within [0, per_cluster]
        c = rng.integers(k)
        if per.sum() < m and per[c] < per_cluster:
            per[c] += 1
        elif per.sum() > m and per[c] > 0:
            per[c] -= 1
    question_clusters = np.repeat(np.arange(k), per)
    lp = make_plan(assignments, neighbors, question_clusters, label)
    c = lp.counts()
    return {"texts": c["docs"], "prompts": c["prompts"], "pairs": c["pairs"]}


# ------------------------------------------------------------------------------------------------ the plan


def plan(
    cfg: PipelineConfig,
    docs: int | None = None,
    clusters: int | None = None,
    questions_per_cluster: int | None = None,
    dedup_survival: float | None = None,
    workload: Workload = Workload(),
    throughput: Throughput = THROUGHPUTS["gpu"],
    gpus: int = 1,
    cpus: int = 16,
    embed_docs: int | None = None,
    dim: int | None = None,
    simulate: bool = False,
    prices: tuple[float, float] | None = None,
) -> dict:
    """Requests, tokens, encoder passes and device hours of every stage. ``docs`` defaults to corpus.limit.

    ``prices``: (USD per million prompt tokens, USD per million completion tokens) of an LLM API, to price the LLM
    stages (and the labelling at full packing) as the paper's cost analysis does (Appendix D)."""
    N = docs if docs is not None else cfg.corpus.limit
    if N is None:
        raise ValueError("the corpus size is unknown: give docs (--docs 6.8M) or set corpus.limit")
    if cfg.corpus.limit is not None:
        N = min(N, cfg.corpus.limit)
    k = clusters if clusters is not None else cfg.cluster.k
    if k < 1 or N < k:
        raise ValueError(f"need 1 <= clusters <= docs (got {k} clusters for {N} documents)")
    if gpus < 1 or cpus < 1:
        raise ValueError("gpus and cpus must be >= 1")
    c, lab, w, tp = cfg.cqg, cfg.label, workload, throughput
    qpc = questions_per_cluster if questions_per_cluster is not None else c.questions_per_prompt
    survival = dedup_survival if dedup_survival is not None else PAPER_DEDUP_SURVIVAL[c.method]
    if not 0 < survival <= 1:
        raise ValueError(f"dedup_survival must be in (0, 1], got {survival}")
    d = dim or ENCODER_DIMS.get(cfg.encode.model, 1024)
    embed_n = N if embed_docs is None else embed_docs

    # --- question generation, probing, selection
    k_gen = min(k, c.max_clusters) if c.max_clusters else k
    gen_tokens, gen_texts = generation_prompt_tokens(cfg, w)
    candidates_per_cluster = qpc * w.parse_rate
    candidates = k_gen * candidates_per_cluster
    probe_texts = c.p_p + c.p_h + c.p_e
    chunks = math.ceil(candidates_per_cluster / lab.questions_per_prompt) if candidates_per_cluster > 0 else 0
    probe_prompts = k_gen * probe_texts * chunks
    probe_pairs = k_gen * probe_texts * candidates_per_cluster
    probe_q_per_prompt = candidates_per_cluster / chunks if chunks else 0
    probe_tokens = probe_prompts * answer_prompt_tokens(probe_q_per_prompt, _text_tokens(w, c.max_text_chars), w)
    per_cluster = int(min(c.t, math.floor(candidates_per_cluster)))
    selected = k_gen * per_cluster
    m = int(round(selected * survival))

    # --- labelling
    texts_per_question = min(lab.n_cluster + lab.n_neighbor + lab.n_random, N)
    pairs = m * texts_per_question
    full_packing = math.ceil(pairs / lab.questions_per_prompt)
    est = label_packing_estimate(N, k, m, per_cluster, lab) if per_cluster else {"texts": 0, "prompts": 0}
    label_prompts = est["prompts"]
    text_tok = _text_tokens(w, lab.max_text_chars)
    # a prompt's tokens are linear in its questions, so the stage's tokens are prompts x (a prompt without questions)
    # + pairs x (one question), however the pairs are packed
    per_q = answer_prompt_tokens(2, text_tok, w) - answer_prompt_tokens(1, text_tok, w)
    per_prompt0 = answer_prompt_tokens(1, text_tok, w) - per_q
    label_tokens = label_prompts * per_prompt0 + pairs * per_q
    label_tokens_full = full_packing * per_prompt0 + pairs * per_q
    # the same pairs with the other random pool, and single-pass (prefix trees: each text once, each question once)
    other = lab.model_copy(update={"random_from": "corpus" if lab.random_from == "labelled" else "labelled"})
    est_other = label_packing_estimate(N, k, m, per_cluster, other) if per_cluster else {"texts": 0, "prompts": 0}
    plans = {lab.random_from: est, other.random_from: est_other}
    tokens_per_pair: dict[str, dict[str, float]] = {}
    for name, e in plans.items():
        packed_tok = e["prompts"] * per_prompt0 + pairs * per_q
        single_tok = single_pass_tokens(e["texts"], pairs, text_tok, w)
        tokens_per_pair[name] = {"packed": round(packed_tok / pairs, 1) if pairs else 0.0, "single": round(single_tok / pairs, 1) if pairs else 0.0,
                                 "texts": e["texts"], "prompts_packed": e["prompts"]}
    # no plan can do with fewer texts than n_cluster of its own cluster for every cluster that has a question
    min_texts = est.get("min_texts", 0)
    tokens_per_pair["floor"] = {"texts": min_texts, "single": round(single_pass_tokens(min_texts, pairs, text_tok, w) / pairs, 1) if pairs else 0.0,
                                "single_without_texts": round(w.question_tokens + w.single_question_overhead_tokens, 1)}
    single = cfg.llm.answer_mode == "single"
    label_requests = pairs if single else label_prompts
    label_prompt_tok = single_pass_tokens(est["texts"], pairs, text_tok, w) if single else label_tokens
    label_completion_tok = pairs if single else pairs * w.answer_tokens  # single-pass: one position read, one token at most
    probe_requests = int(round(probe_pairs)) if single else probe_prompts
    probe_prompt_tok = single_pass_tokens(k_gen * probe_texts, probe_pairs, _text_tokens(w, c.max_text_chars), w) if single else probe_tokens
    probe_completion_tok = probe_pairs if single else probe_pairs * w.answer_tokens

    # --- training, clustering
    train_pairs = pairs * (1 - cfg.train.holdout) * cfg.train.epochs
    kmeans_points = min(N, k * cfg.cluster.max_points_per_centroid)
    kmeans_flops = 2 * kmeans_points * k * d * cfg.cluster.niter + 2 * N * k * d  # training + the assignment pass
    kmeans_core_h = kmeans_flops / KMEANS_FLOPS_PER_CORE / 3600

    def llm_h(prompt_tok: float, completion_tok: float) -> float:
        return (prompt_tok / tp.llm_prompt_tokens_per_s + completion_tok / tp.llm_completion_tokens_per_s) / 3600

    def row(stage, what, requests=None, prompt=None, completion=None, encoded=None, hours=0.0, cpu_core_hours=None, parallel=gpus):
        out = {"stage": stage, "what": what, "llm_requests": requests, "prompt_tokens": None if prompt is None else int(round(prompt)),
               "completion_tokens": None if completion is None else int(round(completion)), "texts_encoded": encoded,
               "device_hours": hours, "cpu_core_hours": cpu_core_hours,
               "wall_hours": (cpu_core_hours / cpus) if cpu_core_hours is not None else hours / parallel}
        if prices is not None and requests is not None:
            out["usd"] = round(prompt * prices[0] / 1e6 + completion * prices[1] / 1e6, 2)
        return out

    gen_completion = k_gen * qpc * (w.question_tokens + 3)  # "N. question?\n" for every question asked
    stages = [
        row("encode", f"encode the corpus ({cfg.encode.model})", encoded=N, hours=N / tp.encoder_texts_per_s / 3600),
        row("cluster", f"k-means on {human(kmeans_points)} points x {d} dims, {cfg.cluster.niter} iterations, then assign all (CPU)",
            cpu_core_hours=kmeans_core_h),
        row("cqg-generate", f"one prompt per cluster with {gen_texts} texts, {qpc} questions asked",
            requests=k_gen, prompt=k_gen * gen_tokens, completion=gen_completion, hours=llm_h(k_gen * gen_tokens, gen_completion)),
        row("cqg-probe", f"{probe_texts} probe texts per cluster, " + (f"each asked the cluster's {qpc} questions single-pass" if single else
                                                                       f"one prompt each with the cluster's {qpc} questions"),
            requests=probe_requests, prompt=probe_prompt_tok, completion=probe_completion_tok, hours=llm_h(probe_prompt_tok, probe_completion_tok)),
        row("cqg-dedup", "embed the candidate questions (dedup at theta)", encoded=int(candidates),
            hours=candidates / tp.encoder_texts_per_s / 3600),
        row("label", f"{human(pairs)} pairs, " + ("single-pass, prefix trees (tokens computed)" if single else
                                                   f"up to {lab.questions_per_prompt} questions per prompt (our packing)"),
            requests=label_requests, prompt=label_prompt_tok, completion=label_completion_tok, hours=llm_h(label_prompt_tok, label_completion_tok)),
        row("train", f"{cfg.train.epochs} epochs x {human(pairs * (1 - cfg.train.holdout))} training pairs",
            hours=train_pairs / tp.train_pairs_per_s / 3600, parallel=min(gpus, cfg.train.num_workers)),
        row("embed", "final embedding pass (encoder + heads)", encoded=embed_n, hours=embed_n / tp.encoder_texts_per_s / 3600),
    ]
    llm_rows = [r for r in stages if r["llm_requests"] is not None]
    totals = {
        "llm_requests": sum(r["llm_requests"] for r in llm_rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in llm_rows),
        "completion_tokens": sum(r["completion_tokens"] for r in llm_rows),
        "texts_encoded": sum(r["texts_encoded"] or 0 for r in stages),
        "gpu_hours": sum(r["device_hours"] for r in stages),
        "cpu_core_hours": kmeans_core_h,
        "wall_hours": sum(r["wall_hours"] for r in stages),
    }
    counts = {
        "docs": N, "clusters": k, "clusters_generated": k_gen, "candidates": int(round(candidates)), "probe_pairs": int(round(probe_pairs)),
        "selected_top_t": selected, "dedup_survival": round(survival, 6), "questions": m,
        "texts_per_question": texts_per_question, "label_pairs": pairs, "holdout_pairs": int(round(pairs * cfg.train.holdout)),
        "label_prompts_full_packing": full_packing, "label_prompt_tokens_full_packing": int(round(label_tokens_full)),
        "label_prompts": label_prompts, "label_texts": est["texts"], "label_questions_per_prompt_max": lab.questions_per_prompt,
        "label_questions_per_prompt": round(pairs / label_prompts, 2) if label_prompts else 0,
        "train_pairs_total": int(round(train_pairs)),
        "label_answer_mode": cfg.llm.answer_mode, "label_random_from": lab.random_from,
        "label_prompt_tokens_per_pair": tokens_per_pair,
    }
    if prices is not None:
        totals["usd"] = round(sum(r["usd"] for r in llm_rows), 2)
        counts["label_usd_full_packing"] = round(label_tokens_full * prices[0] / 1e6 + pairs * w.answer_tokens * prices[1] / 1e6, 2)
    if simulate and per_cluster:
        sim = simulate_label_packing(N, k, m, per_cluster, lab)
        counts.update({"label_prompts_simulated": sim["prompts"], "label_texts_simulated": sim["texts"]})
    return {
        "inputs": {"docs": N, "clusters": k, "questions_per_cluster": qpc, "method": c.method, "gpus": gpus, "cpus": cpus,
                   "embed_docs": embed_n, "dim": d, "llm_backend": cfg.llm.backend, "encoder": cfg.encode.model,
                   "usd_per_m_tokens": list(prices) if prices is not None else None},
        "workload": asdict(w),
        "throughput": asdict(tp),
        "counts": counts,
        "stages": stages,
        "totals": totals,
    }


# ------------------------------------------------------------------------------------------------ output


def format_plan(p: dict) -> str:
    i, c, tp, t = p["inputs"], p["counts"], p["throughput"], p["totals"]
    lines = [
        f"cqg-ray plan: {c['docs']:,} texts, k = {c['clusters']:,} clusters, {i['method']} questions, "
        f"{i['gpus']} x {tp['device']} (+ {i['cpus']} CPU cores for k-means)",
        "",
        f"{'stage':<13} {'LLM requests':>13} {'prompt tok':>11} {'output tok':>11} {'texts enc':>10} {'device h':>9} {'wall h':>8}",
    ]

    def cell(v, fmt="{:,}"):
        return "-" if v is None else fmt.format(v)

    for r in p["stages"]:
        dev = "cpu" if r["cpu_core_hours"] is not None else f"{r['device_hours']:.2f}"
        lines.append(f"{r['stage']:<13} {cell(r['llm_requests']):>13} {cell(r['prompt_tokens'] and human(r['prompt_tokens']), '{}'):>11} "
                     f"{cell(r['completion_tokens'] and human(r['completion_tokens']), '{}'):>11} {cell(r['texts_encoded'] and human(r['texts_encoded']), '{}'):>10} "
                     f"{dev:>9} {r['wall_hours']:>8.2f}")
    lines.append(f"{'total':<13} {t['llm_requests']:>13,} {human(t['prompt_tokens']):>11} {human(t['completion_tokens']):>11} "
                 f"{human(t['texts_encoded']):>10} {t['gpu_hours']:>9.2f} {t['wall_hours']:>8.2f}")
    lines += [
        "",
        f"k-means runs on the CPU: {p['stages'][1]['cpu_core_hours']:.2f} core-hours (from our faiss benchmark's flop rate)",
        f"questions: {c['clusters_generated']:,} clusters x {i['questions_per_cluster']} = {c['candidates']:,} candidates -> top t: "
        f"{c['selected_top_t']:,} -> after dedup ({c['dedup_survival']:.4f} kept): m = {c['questions']:,}",
        f"labelling: m x {c['texts_per_question']:,} texts = {c['label_pairs']:,} (text, question) pairs; at full packing "
        f"({c['label_questions_per_prompt_max']} per prompt, as the paper counts) "
        f"{c['label_prompts_full_packing']:,} prompts, {human(c['label_prompt_tokens_full_packing'])} prompt tokens",
        f"           our packing (estimate): {c['label_prompts']:,} prompts over {c['label_texts']:,} distinct texts "
        f"({c['label_questions_per_prompt']} questions per prompt)",
    ]
    tp_pair = c["label_prompt_tokens_per_pair"]
    lines.append("           prompt tokens per labelled pair (plan x answer mode; * = this config):")
    for name in ("corpus", "labelled"):
        if name in tp_pair:
            v = tp_pair[name]
            star = lambda mode: "*" if (name == c["label_random_from"] and mode == c["label_answer_mode"]) else " "  # noqa: E731
            what = "random texts from the corpus (before)" if name == "corpus" else "random texts from the labelled ones"
            lines.append(f"             {what:<40} {v['texts']:>11,} texts   packed {v['packed']:6.1f}{star('packed')}  single-pass {v['single']:6.1f}{star('single')}")
    if "floor" in tp_pair:
        f = tp_pair["floor"]
        lines.append(f"             floor of any plan with these quotas (each cluster with a question labels n_cluster texts of its own): "
                     f"{f['texts']:,} texts -> single-pass >= {f['single']:.1f}; a question's own line alone costs {f['single_without_texts']:.1f}")
    if "label_prompts_simulated" in c:
        lines.append(f"           our packing (simulated with make_plan on a balanced synthetic clustering): "
                     f"{c['label_prompts_simulated']:,} prompts over {c['label_texts_simulated']:,} texts")
    if "usd" in t:
        lines.append(f"LLM API cost at {i['usd_per_m_tokens'][0]:g} / {i['usd_per_m_tokens'][1]:g} USD per million prompt / output tokens: "
                     f"{t['usd']:,.2f} USD for all LLM stages; the labelling at full packing alone {c['label_usd_full_packing']:,.2f} USD")
    lines += [
        f"throughput per device: LLM {tp['llm_prompt_tokens_per_s']:,.0f} prompt tok/s + {tp['llm_completion_tokens_per_s']:,.0f} "
        f"output tok/s, encoder {tp['encoder_texts_per_s']:,.0f} texts/s, heads {tp['train_pairs_per_s']:,.0f} pairs/s",
        f"  ({tp['source']})",
        f"tokens: {p['workload']['prompt_tokens_per_text']:g} per text (clipped at max_text_chars), "
        f"{p['workload']['question_tokens']:g} per question, {p['workload']['answer_tokens']:g} per answer (assumptions)",
    ]
    return "\n".join(lines)


def _count_arg(s: str) -> int:
    try:
        return parse_count(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML path or packaged config name (default: the built-in paper defaults; `paper` for the paper's run)")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. label.n_cluster=250")
    p.add_argument("--docs", type=_count_arg, help="corpus size N after dedup, e.g. 6.8M (default: corpus.limit)")
    p.add_argument("--clusters", "-k", type=_count_arg, help="k (default: cluster.k)")
    p.add_argument("--questions-per-cluster", type=int, help="questions asked per generation prompt (default: cqg.questions_per_prompt = 10)")
    p.add_argument("--dedup-survival", type=float, help="share of the top-t questions that survive dedup (default: the paper's 9,614/20,000 = 0.4807; QAEmb 10,654/20,000)")
    p.add_argument("--parse-rate", type=float, default=Workload.parse_rate, help="share of generated questions that parse (default 1.0)")
    p.add_argument("--preset", choices=sorted(THROUGHPUTS), default="gpu", help="throughput figures: gpu (assumed H100-class) or cpu (measured on a 2-core machine)")
    p.add_argument("--llm-prompt-tokens-per-s", type=float, help="LLM prefill tokens/s per device")
    p.add_argument("--llm-completion-tokens-per-s", type=float, help="LLM generated tokens/s per device")
    p.add_argument("--llm-tokens-per-s", type=float, help="one figure for both prompt and generated tokens/s per device")
    p.add_argument("--encoder-texts-per-s", type=float, help="encoder texts/s per device")
    p.add_argument("--train-pairs-per-s", type=float, help="MBQA training (text, question) pairs/s per device")
    p.add_argument("--calibrate", metavar="RUN_DIR", help="take the throughputs from a finished (small) run on your hardware: "
                   "its encode manifest, LLM ledgers and training metrics")
    p.add_argument("--prompt-tokens-per-text", type=float, default=Workload.prompt_tokens_per_text, help="mean tokens of a corpus text (default 128)")
    p.add_argument("--question-tokens", type=float, default=Workload.question_tokens, help="tokens per question (default 15)")
    p.add_argument("--answer-tokens", type=float, default=Workload.answer_tokens, help="tokens per answer line (default 4)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs working in parallel (wall hours = device hours / gpus)")
    p.add_argument("--cpus", type=int, help="CPU cores for k-means (default: 16 with the gpu preset, 2 with cpu)")
    p.add_argument("--embed-docs", type=_count_arg, help="texts in the final embedding pass (default: the corpus)")
    p.add_argument("--dim", type=int, help="embedding size (default: from the encoder name, else 1024)")
    p.add_argument("--simulate", action="store_true", help="also run the real labelling planner on a synthetic balanced clustering (exact packing counts; seconds to a minute, ~30 bytes per pair)")
    p.add_argument("--usd-per-m-tokens", type=float, nargs=2, metavar=("PROMPT", "OUTPUT"),
                   help="price an LLM API: USD per million prompt and output tokens (GPT-4o-mini batch, the paper's: 0.075 0.3)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args) -> int:
    from cqg_ray.config import load_config

    cfg = load_config(args.config, args.set)
    tp = THROUGHPUTS[args.preset]
    if args.calibrate:
        try:
            tp = calibrate(args.calibrate, tp)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    changes = {}
    if args.llm_tokens_per_s:
        changes.update(llm_prompt_tokens_per_s=args.llm_tokens_per_s, llm_completion_tokens_per_s=args.llm_tokens_per_s)
    for name in ("llm_prompt_tokens_per_s", "llm_completion_tokens_per_s", "encoder_texts_per_s", "train_pairs_per_s"):
        if getattr(args, name):
            changes[name] = getattr(args, name)
    if changes:
        tp = replace(tp, **changes, source=tp.source + "; overridden on the command line: " + ", ".join(changes))
    w = Workload(prompt_tokens_per_text=args.prompt_tokens_per_text, question_tokens=args.question_tokens,
                 answer_tokens=args.answer_tokens, parse_rate=args.parse_rate)
    try:
        p = plan(cfg, docs=args.docs, clusters=args.clusters, questions_per_cluster=args.questions_per_cluster,
                 dedup_survival=args.dedup_survival, workload=w, throughput=tp, gpus=args.gpus, cpus=args.cpus or (2 if args.preset == "cpu" else 16),
                 embed_docs=args.embed_docs, dim=args.dim, simulate=args.simulate,
                 prices=tuple(args.usd_per_m_tokens) if args.usd_per_m_tokens else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(p, indent=2) if args.json else format_plan(p))
    return 0


def add_commands(sub) -> None:
    """`cqg-ray plan` (called by cqg_ray.cli.build_parser)."""
    p = sub.add_parser("plan", help="capacity planner: LLM requests, tokens, encoder passes and GPU hours of a run",
                       description=__doc__.split("\n\n")[0] + " Throughput figures are assumptions unless you give yours.",
                       epilog="Example (the paper's run): cqg-ray plan --config paper --docs 6.8M --gpus 8")
    add_arguments(p)
    p.set_defaults(func=cmd_plan)
