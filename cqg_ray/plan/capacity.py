"""The capacity plan: requests, tokens, encoder passes and device hours of every stage of one config."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from cqg_ray.config import PipelineConfig
from cqg_ray.plan.format import human
from cqg_ray.plan.memory import llm_model, memory_plan
from cqg_ray.plan.packing import label_packing_estimate, simulate_label_packing
from cqg_ray.plan.throughput import THROUGHPUTS, Throughput
from cqg_ray.plan.tokens import (Workload, answer_prompt_tokens, clipped_text_tokens, context_check, engine_context, generation_prompt_tokens,
                               single_pass_tokens)

# The paper's selected -> deduplicated question counts (Appendix D): 4 questions x 5,000 clusters = 20,000 selected.
PAPER_DEDUP_SURVIVAL = {"cqg": 9_614 / 20_000, "qaemb": 10_654 / 20_000}

# Embedding sizes of known encoders (used for the k-means flop count; --dim for others).
ENCODER_DIMS = {"WhereIsAI/UAE-Large-V1": 1024, "bundled:all-MiniLM-L6-v2": 384, "sentence-transformers/all-MiniLM-L6-v2": 384}

# faiss k-means, bench/cluster.py on this 2-core machine: k=500, 100k x 384, 20 iterations in 3.2 s
# = 2 * 1e5 * 500 * 384 * 20 flop / 3.2 s / 2 cores.
KMEANS_FLOPS_PER_CORE = 2 * 100_000 * 500 * 384 * 20 / 3.2 / 2


def expected_top_t(t: int, parsed: float, survival: float) -> float:
    """Questions a cluster keeps at top t: E[min(t, X)], X ~ Binomial(n, survival) the parsed questions no filter
    dropped, n the parsed questions a cluster (a fraction of one: between the two whole numbers around it)."""
    from scipy.stats import binom

    def at(n: int) -> float:
        x = np.arange(n + 1)
        return float(np.minimum(x, t) @ binom.pmf(x, n, survival)) if n > 0 else 0.0

    lo = math.floor(parsed + 1e-9)
    frac = max(0.0, parsed - lo)
    return (1 - frac) * at(lo) + (frac * at(lo + 1) if frac > 1e-9 else 0.0)


def capacity_plan(
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
    stages (and the labelling at full packing) as the paper's cost analysis does (Appendix C)."""
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
    if not 0 < w.filter_survival <= 1:
        raise ValueError(f"filter_survival must be in (0, 1], got {w.filter_survival}")
    k_gen = min(k, c.max_clusters) if c.max_clusters else k
    gen_tokens, gen_texts = generation_prompt_tokens(cfg, w)
    context = engine_context(cfg)[0]
    if context is not None:  # a prompt over the context is clipped to fit it (context_check says so): it reads no more
        gen_tokens = min(gen_tokens, max(1, context - cfg.llm.max_tokens_generate))
    ppc = c.prompts_per_cluster if c.method == "cqg" else 1
    gen_requests = k_gen * ppc
    candidates_per_cluster = ppc * qpc * w.parse_rate
    candidates = k_gen * candidates_per_cluster
    filter_survival = w.filter_survival if c.filters else 1.0
    eligible_per_cluster = candidates_per_cluster * filter_survival
    probe_texts = c.p_p + c.p_h + c.p_e
    chunks = math.ceil(candidates_per_cluster / lab.questions_per_prompt) if candidates_per_cluster > 0 else 0
    probe_prompts = k_gen * probe_texts * chunks
    probe_pairs = k_gen * probe_texts * candidates_per_cluster
    probe_q_per_prompt = candidates_per_cluster / chunks if chunks else 0
    probe_tokens = probe_prompts * answer_prompt_tokens(probe_q_per_prompt, clipped_text_tokens(w, c.max_text_chars), w)
    top_t = expected_top_t(c.t, candidates_per_cluster, filter_survival)
    per_cluster = max(1, round(top_t)) if top_t > 0 else 0  # the label plan's questions a cluster (a whole number)
    selected = int(round(k_gen * top_t))
    m = int(round(selected * survival))

    # --- labelling
    texts_per_question = min(lab.n_cluster + lab.n_neighbor + lab.n_random, N)
    pairs = m * texts_per_question
    full_packing = math.ceil(pairs / lab.questions_per_prompt)
    est = label_packing_estimate(N, k, m, per_cluster, lab) if per_cluster else {"texts": 0, "prompts": 0}
    label_prompts = est["prompts"]
    text_tok = clipped_text_tokens(w, lab.max_text_chars)
    # a prompt's tokens are linear in its questions, so the stage's tokens are prompts x (a prompt without questions)
    # + pairs x (one question), however the pairs are packed
    per_q = answer_prompt_tokens(2, text_tok, w) - answer_prompt_tokens(1, text_tok, w)
    per_prompt0 = answer_prompt_tokens(1, text_tok, w) - per_q
    label_tokens = label_prompts * per_prompt0 + pairs * per_q
    label_tokens_full = full_packing * per_prompt0 + pairs * per_q
    # the same pairs with the other random pool, and single-pass (prefix trees: each text once, each question once)
    other = lab.model_copy(update={"random_from": "corpus" if lab.random_from == "labelled" else "labelled"})
    est_other = label_packing_estimate(N, k, m, per_cluster, other) if per_cluster else {"texts": 0, "prompts": 0}
    by_pool = {lab.random_from: est, other.random_from: est_other}
    tokens_per_pair: dict[str, dict[str, float]] = {}
    for name, e in by_pool.items():
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
    probe_prompt_tok = single_pass_tokens(k_gen * probe_texts, probe_pairs, clipped_text_tokens(w, c.max_text_chars), w) if single else probe_tokens
    probe_completion_tok = probe_pairs if single else probe_pairs * w.answer_tokens

    # --- training, clustering
    train_pairs = pairs * (1 - cfg.train.holdout) * cfg.train.epochs
    kmeans_points = min(N, k * cfg.cluster.max_points_per_centroid)
    kmeans_flops = 2 * kmeans_points * k * d * cfg.cluster.niter + 2 * N * k * d  # training + the assignment pass
    kmeans_core_h = kmeans_flops / KMEANS_FLOPS_PER_CORE / 3600

    def llm_h(prompt_tok: float, completion_tok: float, rates: tuple[float, float] = (tp.llm_prompt_tokens_per_s, tp.llm_completion_tokens_per_s)) -> float:
        return (prompt_tok / rates[0] + completion_tok / rates[1]) / 3600

    def answer_h(prompt_tok: float, completion_tok: float) -> float:  # single-pass: the answer is read, not decoded
        return llm_h(prompt_tok, 0.0 if single else completion_tok)

    def row(stage, what, requests=None, prompt=None, completion=None, encoded=None, hours=0.0, cpu_core_hours=None, parallel=gpus):
        out = {"stage": stage, "what": what, "llm_requests": requests, "prompt_tokens": None if prompt is None else int(round(prompt)),
               "completion_tokens": None if completion is None else int(round(completion)), "texts_encoded": encoded,
               "device_hours": hours, "cpu_core_hours": cpu_core_hours,
               "wall_hours": (cpu_core_hours / cpus) if cpu_core_hours is not None else hours / parallel}
        if prices is not None and requests is not None:
            out["usd"] = round(prompt * prices[0] / 1e6 + completion * prices[1] / 1e6, 2)
        return out

    gen_completion = gen_requests * qpc * (w.question_tokens + 3)  # "N. question?\n" for every question asked
    writer = c.writer_model or llm_model(cfg) or cfg.llm.backend
    stages = [
        row("encode", f"encode the corpus ({cfg.encode.model})", encoded=N, hours=N / tp.encoder_texts_per_s / 3600),
        row("cluster", f"k-means on {human(kmeans_points)} points x {d} dims, {cfg.cluster.niter} iterations, then assign all (CPU)",
            cpu_core_hours=kmeans_core_h),
        row("cqg-generate", f"{ppc} prompt(s) per cluster with {gen_texts} texts, {qpc} questions asked, written by {writer}",
            requests=gen_requests, prompt=gen_requests * gen_tokens, completion=gen_completion,
            hours=llm_h(gen_requests * gen_tokens, gen_completion, tp.writer)),
        row("cqg-probe", f"{probe_texts} probe texts per cluster, " + (f"each asked the cluster's {qpc} questions single-pass" if single else
                                                                       f"one prompt each with the cluster's {qpc} questions"),
            requests=probe_requests, prompt=probe_prompt_tok, completion=probe_completion_tok, hours=answer_h(probe_prompt_tok, probe_completion_tok)),
        row("cqg-dedup", "embed the candidate questions (dedup at theta)", encoded=int(candidates),
            hours=candidates / tp.encoder_texts_per_s / 3600),
        row("label", f"{human(pairs)} pairs, " + ("single-pass, prefix trees (tokens computed)" if single else
                                                   f"up to {lab.questions_per_prompt} questions per prompt (our packing)"),
            requests=label_requests, prompt=label_prompt_tok, completion=label_completion_tok, hours=answer_h(label_prompt_tok, label_completion_tok)),
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
        "docs": N, "clusters": k, "clusters_generated": k_gen, "generation_prompts": gen_requests, "prompts_per_cluster": ppc,
        "candidates": int(round(candidates)), "filters": list(c.filters), "filter_survival": filter_survival,
        "eligible": int(round(k_gen * eligible_per_cluster)), "probe_pairs": int(round(probe_pairs)), "writer": writer,
        "selected_top_t": selected, "dedup_survival": round(survival, 6), "questions": m,
        "texts_per_question": texts_per_question, "label_pairs": pairs, "holdout_pairs": int(round(pairs * cfg.train.holdout)),
        # each question's held-out labels (expected): the select part calibrates and picks, the report part is shown
        "heldout_select_per_question": round(texts_per_question * cfg.train.holdout * cfg.train.select_share, 1),
        "heldout_report_per_question": round(texts_per_question * cfg.train.holdout * (1 - cfg.train.select_share), 1),
        "train_labels_per_question": round(texts_per_question * (1 - cfg.train.holdout), 1),
        "min_heldout": cfg.train.min_heldout, "min_heldout_yes": cfg.train.min_heldout_yes,
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
        "context": context_check(cfg, w),
        "stages": stages,
        "totals": totals,
        "memory": memory_plan(cfg, counts, d, w),
    }
