"""The CQG stage (`cqg-ray cqg`): sample, generate, probe, score, select, dedup, report.

Reads prepare/ (texts), cluster/ (assignments, neighbours); writes under questions/:

    samples.parquet        cluster, role (positive|hard|easy|article), doc_id          the generation prompts' texts
    keywords.parquet       cluster, keywords (c-TF-IDF words the property prompt shows; only with cqg.keywords > 0)
    generations.parquet    cluster, ok, raw text, parsed questions, dropped counts, tokens
    probes.parquet         cluster, doc_id, role, candidate ids, answers               one A.3 prompt per probe text
    candidates.parquet     every parsed question with its probe counts, quality (Eq. 1), top_t / kept flags
    questions.parquet      the selected questions (question_id 0..m-1, best quality first)
    report.md, quality_hist.png, stats.json

Every LLM call goes through ``cqg_ray.llm.runner.run_requests`` (ledger stages ``<method>-generate`` and
``<method>-probe``), so a killed stage re-run repeats no finished call.

Probing: for each cluster, p_p positive, p_h hard-negative and p_e easy-negative probe texts are drawn once
and shared by the cluster's questions; one A.3 prompt asks all of the cluster's questions about one probe
text. Each question is still judged on p_p / p_h / p_e random probes (Equation 1) while the number of
prompts drops from (p_p + p_h + p_e) per question to (p_p + p_h + p_e) per cluster.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import Clusters, load_texts
from cqg_ray.config import PipelineConfig, check_corpus_size
from cqg_ray.cqg.sampling import Sample, generation_samples, probe_samples, qaemb_articles
from cqg_ray.cqg.select import own_cluster_no, quality, quality_medians, select, text_filters
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")

ROLES = ("positive", "hard", "easy")


def _samples_rows(samples: list[Sample], doc_ids: np.ndarray, kind: str) -> dict[str, list]:
    rows: dict[str, list] = {"cluster": [], "role": [], "doc_id": []}
    for s in samples:
        for role, arr in zip(ROLES, (s.positives, s.hard, s.easy)):
            for i in arr:
                rows["cluster"].append(s.cluster)
                rows["role"].append(role if kind == "cqg" else "article")
                rows["doc_id"].append(str(doc_ids[i]))
    return rows


def generation_requests(cfg: PipelineConfig, samples: list[Sample], texts: dict[str, str], doc_ids: np.ndarray, fitter=None,
                        keywords: dict[int, list[str]] | None = None):
    """One generation request per cluster (``cqg.prompt``: the property prompt or A.1; A.2 for qaemb), its texts clipped
    to cqg.max_text_chars and, with a ``fitter`` (``cqg_ray.llm.fit.PromptFitter``), clipped further or dropped until
    the prompt fits the engine. ``keywords``: each cluster's c-TF-IDF words, shown by the property prompt."""
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.fit import PromptFitter
    from cqg_ray.llm.prompts import clip_text, cqg_messages, property_messages, qaemb_messages

    c = cfg.cqg
    fitter = fitter or PromptFitter(None, f"{c.method}-generate")
    reqs = []
    for s in samples:
        clip = lambda idx: [clip_text(texts[str(doc_ids[i])], c.max_text_chars) for i in idx]  # noqa: E731
        meta = {"cluster": int(s.cluster)}
        if c.method == "cqg":
            neg = np.concatenate([s.hard, s.easy])
            neg = np.random.default_rng([c.seed, 3, s.cluster]).permutation(neg)  # hard and easy mixed, as one list
            if len(s.positives) == 0 or len(neg) == 0:
                continue
            if c.prompt == "property":
                kw = (keywords or {}).get(int(s.cluster), [])
                build = lambda pos, ng, kw=kw: Request(property_messages(pos, ng, c.questions_per_prompt, c.examples, kw),  # noqa: E731
                                                       max_tokens=cfg.llm.max_tokens_generate, meta=meta)
            else:
                build = lambda pos, ng: Request(cqg_messages(pos, ng, c.questions_per_prompt), max_tokens=cfg.llm.max_tokens_generate, meta=meta)  # noqa: E731
            req, _, _ = fitter.contrast(clip(s.positives), clip(neg), build, what=f"cluster {s.cluster}")
        else:
            if len(s.positives) == 0:
                continue
            build = lambda pos, ng: Request(qaemb_messages(pos, n_questions=c.questions_per_prompt), max_tokens=cfg.llm.max_tokens_generate, meta=meta)  # noqa: E731
            req, _, _ = fitter.contrast(clip(s.positives), [], build, what=f"cluster {s.cluster}")
        reqs.append(req)
    return reqs


def example_questions(c) -> list[str]:
    """The worked examples' questions the generation prompt showed (the property prompt's ``cqg.examples``)."""
    from cqg_ray.llm.prompts import PROPERTY_EXAMPLES

    if c.method != "cqg" or c.prompt != "property":
        return []
    return [q for _, _, qs in PROPERTY_EXAMPLES[: c.examples] for q in qs]


def cluster_keywords(c, doc_ids: np.ndarray, texts: dict[str, str], samples: dict[int, np.ndarray]) -> dict[int, list[str]]:
    """{cluster: its ``c.keywords`` c-TF-IDF words} over every cluster's keyword sample (``samples``), for the property
    prompt; empty when the prompt shows none."""
    from cqg_ray.cqg.keywords import ctfidf

    if not samples:
        return {}
    ks = sorted(samples)
    words = ctfidf([[texts[str(doc_ids[i])] for i in samples[k]] for k in ks], c.keywords)
    return dict(zip(ks, words))


def writer_llm(cfg: PipelineConfig):
    """The LLM section that writes the questions: the run's, with ``cqg.writer_model`` in place of its model when set."""
    llm = cfg.llm
    if not cfg.cqg.writer_model:
        return llm
    if llm.backend == "fake":
        return llm
    section = getattr(llm, llm.backend)
    return llm.model_copy(update={llm.backend: section.model_copy(update={"model": cfg.cqg.writer_model})})


def probe_requests(cfg: PipelineConfig, probes: list[Sample], cand: dict[int, list[int]], cand_text: list[str],
                   texts: dict[str, str], doc_ids: np.ndarray, fitter=None):
    """The probe requests (every candidate of a cluster asked about each of its probe texts); with a ``fitter`` a
    text too long for the engine is clipped."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.fit import PromptFitter
    from cqg_ray.llm.prompts import clip_text

    fitter = fitter or PromptFitter(None, f"{cfg.cqg.method}-probe")
    reqs = []
    for s in probes:
        qids = cand.get(s.cluster, [])
        if not qids:
            continue
        for role, arr in zip(ROLES, (s.positives, s.hard, s.easy)):
            for i in arr:
                text = clip_text(texts[str(doc_ids[i])], cfg.cqg.max_text_chars)
                meta = {"cluster": int(s.cluster), "doc_id": str(doc_ids[i]), "role": role}
                build = lambda t: answer_requests(t, qids, cand_text, cfg.llm.answer_mode, cfg.label.questions_per_prompt,  # noqa: E731
                                                  cfg.llm.max_tokens_answer, meta=meta)
                reqs.extend(fitter.text(text, build, what=f"probe text {doc_ids[i]} (cluster {s.cluster})"))
    return reqs


def probe_counts(results, n_cand: int) -> dict[str, np.ndarray]:
    """Per candidate: yes and answered counts for positive, hard and easy probes (pure)."""
    out = {f"{r}_{k}": np.zeros(n_cand, np.int64) for r in ROLES for k in ("yes", "n")}
    for r in results:
        if not r.ok or r.answers is None:
            continue
        role = r.meta["role"]
        for q, a in zip(r.meta["question_ids"], r.answers):
            out[f"{role}_n"][q] += 1
            out[f"{role}_yes"][q] += int(a)
    return out


def run_cqg(cfg: PipelineConfig, ctx: StageContext, backend=None, progress: bool = True) -> None:
    """The whole stage. ``backend``: an LLM backend to use instead of building one from cfg.llm (tests)."""
    from cqg_ray.llm.fit import PromptFitter, budget_summary, stage_budget
    from cqg_ray.llm.parse import parse_questions
    from cqg_ray.llm.runner import run_requests, stage_stats

    c = cfg.cqg
    run = ctx.run
    cl = Clusters.load(run)
    check_corpus_size(cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"k": cl.k})}), len(cl.doc_ids))
    index = cl.index()
    clusters = list(range(cl.k))[: c.max_clusters] if c.max_clusters else list(range(cl.k))
    t0 = time.time()

    # 1. sampling
    if c.method == "cqg":
        gen = generation_samples(index, cl.neighbors, clusters, c.n_p, c.n_h, c.n_e, c.hard_neighbors, c.seed, c.prompts_per_cluster)
    else:
        gen = [Sample(k, qaemb_articles(index, k, c.qaemb_articles, c.seed), np.zeros(0, np.int64), np.zeros(0, np.int64)) for k in clusters]
    probes = probe_samples(index, cl.neighbors, gen, c.p_p, c.p_h, c.p_e, c.hard_neighbors, c.seed)
    from cqg_ray.cqg.keywords import keyword_sample

    show_keywords = c.method == "cqg" and c.prompt == "property" and c.keywords > 0
    kw_samples = {k: keyword_sample(index.members(k), c.keyword_texts, c.seed, k) for k in range(cl.k)} if show_keywords else {}
    need = set()
    for s in gen + probes:
        need.update(cl.doc_ids[np.concatenate([s.positives, s.hard, s.easy])].tolist())
    for ids in kw_samples.values():
        need.update(cl.doc_ids[ids].tolist())
    texts = load_texts(run, sorted(need))
    run.write_table(f"{ctx.stage}/samples.parquet", pa.table(_samples_rows(gen, cl.doc_ids, c.method)))
    keywords = cluster_keywords(c, cl.doc_ids, texts, kw_samples)
    if keywords:
        run.write_table(f"{ctx.stage}/keywords.parquet", pa.table({"cluster": pa.array(list(keywords), pa.int32()),
                                                                   "keywords": pa.array(list(keywords.values()), pa.list_(pa.string()))}))

    # 2. generation
    wllm = writer_llm(cfg)
    gbackend = backend if wllm is cfg.llm else None  # a writer of its own gets its own backend
    budget = stage_budget(cfg.llm, backend)
    gfit = PromptFitter(stage_budget(wllm, gbackend), f"{c.method}-generate")
    greqs = generation_requests(cfg, gen, texts, cl.doc_ids, gfit, keywords)
    gfit.log()
    prompt = c.prompt if c.method == "cqg" else "qaemb"
    log.info("cqg: %d clusters, %d generation prompts (%s, prompt %s, writer %s)", len(clusters), len(greqs), c.method, prompt,
             c.writer_model or "the run's llm")
    gres = run_requests(greqs, wllm, run, f"{c.method}-generate", progress=progress, backend=gbackend)
    cand_text: list[str] = []
    cand_cluster: list[int] = []
    cand_rank: list[int] = []
    cand_key: list[str] = []
    cand_stopped_last: list[bool] = []  # the last item of a reply that stopped on the token limit
    cand: dict[int, list[int]] = {}
    dropped = {"empty": 0, "not_yes_no": 0, "duplicate": 0}
    grows: dict[str, list] = {"cluster": [], "ok": [], "text": [], "questions": [], "dropped": [], "prompt_tokens": [], "completion_tokens": [], "key": []}
    for r in gres:
        k = int(r.meta["cluster"])
        qs = parse_questions(r.text) if r.ok else []
        d = getattr(qs, "dropped", {})
        for key, v in d.items():
            dropped[key] = dropped.get(key, 0) + v
        stopped = r.ok and r.completion_tokens >= cfg.llm.max_tokens_generate
        for j, q in enumerate(qs):
            cand.setdefault(k, []).append(len(cand_text))
            cand_text.append(q)
            cand_cluster.append(k)
            cand_rank.append(j)
            cand_key.append(r.key)
            cand_stopped_last.append(stopped and j == len(qs) - 1)
        for col, v in (("cluster", k), ("ok", r.ok), ("text", r.text), ("questions", list(qs)), ("dropped", json.dumps(d)),
                       ("prompt_tokens", r.prompt_tokens), ("completion_tokens", r.completion_tokens), ("key", r.key)):
            grows[col].append(v)
    run.write_table(f"{ctx.stage}/generations.parquet", pa.table(grows, schema=pa.schema([
        ("cluster", pa.int32()), ("ok", pa.bool_()), ("text", pa.string()), ("questions", pa.list_(pa.string())), ("dropped", pa.string()),
        ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("key", pa.string())])))
    n_cand = len(cand_text)
    if n_cand == 0:
        raise RuntimeError("cqg: the LLM produced no usable question (see questions/generations.parquet and the llm ledger)")

    # 3. text filters (they drop, never rewrite), then probing (Equation 1) of the questions left
    from cqg_ray.artifacts import corpus_texts
    from cqg_ray.cqg.quality import copied

    copies = copied(cand_text, corpus_texts(run)) if "copy" in c.filters else np.zeros(n_cand, bool)
    reasons = np.array(text_filters(cand_text, c.filters, c.max_question_words, copies, np.array(cand_stopped_last),
                                    example_questions(c)), dtype=object)
    to_probe = {k: [i for i in ids if not reasons[i]] for k, ids in cand.items()}
    log.info("cqg: text filters dropped %s of %d candidates", {f: int(np.sum(reasons == f)) for f in ("copy", "example", "long", "cut_off")},
             n_cand)
    pfit = PromptFitter(budget, f"{c.method}-probe")
    preqs = probe_requests(cfg, probes, to_probe, cand_text, texts, cl.doc_ids, pfit)
    pfit.log()
    log.info("cqg: %d candidate questions, %d probe prompts", n_cand, len(preqs))
    pres = run_requests(preqs, cfg.llm, run, f"{c.method}-probe", progress=progress, backend=backend)
    counts = probe_counts(pres, n_cand)
    prow: dict[str, list] = {"cluster": [], "doc_id": [], "role": [], "question_ids": [], "answers": [], "ok": []}
    for r in pres:
        prow["cluster"].append(r.meta["cluster"])
        prow["doc_id"].append(r.meta["doc_id"])
        prow["role"].append(r.meta["role"])
        prow["question_ids"].append(r.meta["question_ids"])
        prow["answers"].append(r.answers)
        prow["ok"].append(r.ok)
    run.write_table(f"{ctx.stage}/probes.parquet", pa.table(prow, schema=pa.schema([
        ("cluster", pa.int32()), ("doc_id", pa.string()), ("role", pa.string()), ("question_ids", pa.list_(pa.int64())),
        ("answers", pa.list_(pa.bool_())), ("ok", pa.bool_())])))
    neg_yes = counts["hard_yes"] + counts["easy_yes"]
    neg_n = counts["hard_n"] + counts["easy_n"]
    q = quality(counts["positive_yes"], counts["positive_n"], neg_yes, neg_n)
    if "own_cluster" in c.filters:
        reasons[(reasons == "") & own_cluster_no(counts["positive_yes"], counts["positive_n"])] = "own_cluster"

    # 4. selection: top t per cluster among the questions no filter dropped, then global dedup at theta (best quality first),
    #    redone while one opening holds more than cqg.max_opening_share of the kept questions (the opening filter)
    cl_arr = np.array(cand_cluster)
    eligible_q = np.where(reasons == "", q, np.nan)
    from cqg_ray.cqg.quality import opening
    from cqg_ray.encoder import load_encoder

    enc = load_encoder(cfg.encode.model, backend=cfg.encode.backend)
    emb = enc.encode(cand_text, batch_size=128)
    share = c.max_opening_share if "opening" in c.filters else 1.0
    chosen, kept, dup_of, capped = select(cl_arr, eligible_q, emb, c.t, c.theta_value, [opening(x) for x in cand_text], share)
    reasons[capped] = "opening"

    rate = lambda y, n: np.where(n > 0, y / np.maximum(n, 1), np.nan)  # noqa: E731
    is_top = np.zeros(n_cand, bool)
    is_top[chosen] = True
    is_kept = np.zeros(n_cand, bool)
    is_kept[kept] = True
    candidates = pa.table({
        "candidate_id": np.arange(n_cand), "cluster": cl_arr.astype(np.int32), "rank_in_generation": np.array(cand_rank, np.int32),
        "text": cand_text, "quality": q, "positive_yes_rate": rate(counts["positive_yes"], counts["positive_n"]),
        "hard_yes_rate": rate(counts["hard_yes"], counts["hard_n"]), "easy_yes_rate": rate(counts["easy_yes"], counts["easy_n"]),
        "negative_yes_rate": rate(neg_yes, neg_n), **{k: v for k, v in counts.items()},
        "filtered": pa.array(reasons.tolist(), pa.string()), "stopped_last": np.array(cand_stopped_last, bool),
        "top_t": is_top, "kept": is_kept, "duplicate_of": dup_of, "generation_key": cand_key,
    })
    run.write_table(f"{ctx.stage}/candidates.parquet", candidates)
    sel = candidates.take(pa.array(kept)).drop_columns(["filtered", "stopped_last", "top_t", "kept", "duplicate_of"])
    sel = sel.add_column(0, "question_id", pa.array(np.arange(len(kept)), pa.int32()))
    sel = sel.append_column("method", pa.array([c.method] * len(kept), pa.string()))
    run.write_table(f"{ctx.stage}/questions.parquet", sel)

    gstats, pstats = stage_stats(run, f"{c.method}-generate"), stage_stats(run, f"{c.method}-probe")
    ctx.counts.update({
        "clusters": len(clusters), "generation_prompts": len(greqs), "generation_failed": int(sum(not r.ok for r in gres)),
        "generated": n_cand + sum(dropped.values()), "parsed": n_cand, **{f"dropped_{k}": v for k, v in dropped.items()},
        "probe_prompts": len(preqs), "probe_failed": int(sum(not r.ok for r in pres)),
        **{f"dropped_{f}": int(np.sum(reasons == f)) for f in ("copy", "example", "long", "cut_off", "own_cluster", "opening")},
        "probed": int(np.sum(~np.isnan(q))), "selected_top_t": int(len(chosen)), "deduped": int(len(chosen) - len(kept)), "questions": int(len(kept)),
        "mean_quality_selected": round(float(np.nanmean(q[kept])), 4) if len(kept) else None,
        **quality_medians(q, is_kept),
        **{f"generation_{k}": v for k, v in gfit.report().items()}, **{f"probe_{k}": v for k, v in pfit.report().items()},
    })
    ctx.extra["prompt_budget"] = budget_summary(budget)
    ctx.extra["prompt"] = prompt  # build.json names the generation prompt and the writer
    ctx.extra["writer"] = c.writer_model or None
    ctx.extra["llm"] = {"generate": gstats.get("totals", gstats), "probe": pstats.get("totals", pstats)}
    ctx.extra["wall_s"] = round(time.time() - t0, 1)
    run.write_json(f"{ctx.stage}/stats.json", {"counts": ctx.counts, "llm": ctx.extra["llm"]})
    from cqg_ray.cqg.report import write_report

    write_report(run, ctx.stage, cfg, candidates, texts, cl.doc_ids, gen, ctx.counts, ctx.extra["llm"])

