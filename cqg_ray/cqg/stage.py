"""The CQG stage (`cqg-ray cqg`): sample, generate, probe, score, select, dedup, report.

Reads prepare/ (texts), cluster/ (assignments, neighbours); writes under questions/:

    samples.parquet        cluster, role (positive|hard|easy|article), doc_id          the generation prompts' texts
    keywords.parquet       cluster, keywords (c-TF-IDF words the property prompt shows; only with cqg.keywords > 0)
    generations.parquet    cluster, ok, raw text, parsed questions, dropped counts, tokens
    probes.parquet         cluster, doc_id, role, candidate ids, answers               one row per probe text
    generate/, probe/      the plans the workers read (probe/candidates.parquet: the candidates' texts)
    candidates.parquet     every parsed question with its probe counts, quality (Eq. 1), top_t / kept flags
    questions.parquet      the selected questions (question_id 0..m-1, best quality first)
    embeddings.parquet     question_id, embedding: the selected questions by the run's encoder (dedup's; the question prior's)
    report.md, quality_hist.png, stats.json

The LLM work streams (``cqg_ray.cqg.jobs`` on ``cqg_ray.llm.stream``): the generation prompts and the probe texts are
written as plans (``generate/plan.parquet``, ``probe/plan.parquet``) that workers read, answer through the engine
pool and assemble (ledger stages ``<method>-generate`` and ``<method>-probe``: a killed stage re-run repeats no
finished call). The driver holds the samples' row indices, the candidates and their counters; the keywords and the
copy filter read texts in tasks.

Probing: for each cluster, p_p positive, p_h hard-negative and p_e easy-negative probe texts are drawn once
and shared by the cluster's questions, so each question is judged on p_p / p_h / p_e random probes (Equation 1).
They are answered as ``llm.answer_mode`` says: single-pass by default (one question a prompt, the probe text's prefix
shared), or packed, where one A.3 prompt asks all of the cluster's questions about one probe text.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from cqg_ray.artifacts import QUESTION_EMBEDDINGS, Clusters, load_texts, question_embeddings_table
from cqg_ray.config import PipelineConfig, check_corpus_size, llm_with_model
from cqg_ray.cqg.jobs import ROLES
from cqg_ray.cqg.sampling import Sample, generation_samples, probe_samples, qaemb_articles
from cqg_ray.cqg.select import own_cluster_no, quality, quality_medians, select, text_filters
from cqg_ray.rundir import StageContext

log = logging.getLogger("cqg_ray")

GENERATE_ROWS = 16  # generation prompts a batch: enough for an engine's batched decoding, small enough to spread over a pool


def _samples_rows(samples: list[Sample], doc_ids: np.ndarray, kind: str) -> dict[str, list]:
    rows: dict[str, list] = {"cluster": [], "role": [], "doc_id": []}
    for s in samples:
        for role, arr in zip(ROLES, (s.positives, s.hard, s.easy)):
            for i in arr:
                rows["cluster"].append(s.cluster)
                rows["role"].append(role if kind == "cqg" else "article")
                rows["doc_id"].append(str(doc_ids[i]))
    return rows


def example_questions(c) -> list[str]:
    """The worked examples' questions the generation prompt showed (the property prompt's ``cqg.examples``)."""
    from cqg_ray.llm.prompts import PROPERTY_EXAMPLES

    if c.method != "cqg" or c.prompt != "property":
        return []
    return [q for _, _, qs in PROPERTY_EXAMPLES[: c.examples] for q in qs]


def writer_llm(cfg: PipelineConfig):
    """The LLM section that writes the questions: the run's, with ``cqg.writer_model`` in place of its model when set."""
    return llm_with_model(cfg.llm, cfg.cqg.writer_model)


def keywords_of(run_root: str, c, samples: dict[int, list[str]]) -> dict[int, list[str]]:
    """{cluster: its c-TF-IDF words} from the clusters' keyword samples (doc ids), the texts read here (a task on Ray)."""
    from cqg_ray.artifacts import load_texts
    from cqg_ray.rundir import RunDir

    texts = load_texts(RunDir(run_root), sorted({d for ids in samples.values() for d in ids}))
    ks = sorted(samples)
    from cqg_ray.cqg.keywords import ctfidf

    return dict(zip(ks, ctfidf([[texts[d] for d in samples[k]] for k in ks], c.keywords)))


def copies_of(run_root: str, questions: list[str]) -> np.ndarray:
    """Per question: whether it shares a run of words with a corpus text (``quality.copied``); one task per shard on Ray."""
    import ray

    from cqg_ray.artifacts import corpus_shards
    from cqg_ray.cqg.quality import copied
    from cqg_ray.rundir import RunDir

    def shard_copies(root: str, path: str, qs: list[str]) -> np.ndarray:
        import pyarrow.parquet as pq

        run = RunDir(root)
        t = pq.ParquetFile(path, filesystem=run.fs)
        return copied(qs, (x for b in t.iter_batches(columns=["text"], batch_size=10_000) for x in b.column(0).to_pylist()))

    paths = corpus_shards(RunDir(run_root))
    if not ray.is_initialized():
        return np.logical_or.reduce([shard_copies(run_root, p, questions) for p in paths] or [np.zeros(len(questions), bool)])
    ref = ray.put(questions)
    hits = ray.get([ray.remote(shard_copies).remote(run_root, p, ref) for p in paths])
    return np.logical_or.reduce(hits or [np.zeros(len(questions), bool)])


def run_cqg(cfg: PipelineConfig, ctx: StageContext, backend=None, progress: bool = True) -> None:
    """The whole stage. ``backend``: an LLM backend to use instead of building one from cfg.llm (tests)."""
    from cqg_ray.cqg.jobs import (GENERATE_PLAN, PROBE_CANDIDATES, PROBE_PLAN, GenerateJob, ProbeJob, fold_probe_counts,
                                  generation_plan, probe_plan)
    from cqg_ray.llm.base import backend_identity
    from cqg_ray.llm.backends import stage_budget
    from cqg_ray.llm.fit import budget_summary, fit_report
    from cqg_ray.llm.parse import loops
    from cqg_ray.llm.stream import corpus_places, rows_per_group, stream_plan, write_plan

    import ray

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
    run.write_table(f"{ctx.stage}/samples.parquet", pa.table(_samples_rows(gen, cl.doc_ids, c.method)))
    keywords: dict[int, list[str]] = {}
    if show_keywords:
        kw_samples = {k: cl.doc_ids.take(keyword_sample(index.members(k), c.keyword_texts, c.seed, k)).to_pylist() for k in range(cl.k)}
        keywords = ray.get(ray.remote(keywords_of).remote(run.root_uri, c, kw_samples)) if ray.is_initialized() else \
            keywords_of(run.root_uri, c, kw_samples)
        del kw_samples
        run.write_table(f"{ctx.stage}/keywords.parquet", pa.table({"cluster": pa.array(list(keywords), pa.int32()),
                                                                   "keywords": pa.array(list(keywords.values()), pa.list_(pa.string()))}))
    places = corpus_places(run, cl.doc_ids)

    # 2. generation (a plan that workers answer: ledger stage <method>-generate)
    wllm = writer_llm(cfg)
    gbackend = backend if wllm is cfg.llm else None  # a writer of its own gets its own backend
    budget = stage_budget(cfg.llm, backend)
    gplan = generation_plan(cfg, gen, places, keywords)
    groups = write_plan(run, f"{ctx.stage}/{GENERATE_PLAN}", gplan, GENERATE_ROWS)
    prompt = c.prompt if c.method == "cqg" else "qaemb"
    log.info("cqg: %d clusters, %d generation prompts (%s, prompt %s, writer %s)", len(clusters), gplan.num_rows, c.method, prompt,
             c.writer_model or "the run's llm")
    del gplan
    gjob = GenerateJob(run.root_uri, ctx.stage, f"{c.method}-generate", cfg, wllm)
    gdone = stream_plan(gjob, groups, gbackend.identity if gbackend is not None else backend_identity(wllm), backend=gbackend)
    gen_table = run.read_table(f"{ctx.stage}/generations.parquet")
    cand_text: list[str] = []
    cand_cluster: list[int] = []
    cand_rank: list[int] = []
    cand_key: list[str] = []
    cand_stopped_last: list[bool] = []  # the last item of a reply that stopped on the token limit
    cand: dict[int, list[int]] = {}
    dropped = {"empty": 0, "not_yes_no": 0, "duplicate": 0, **gdone["assemble"].get("dropped", {})}
    looped = at_cap = 0  # replies that loop (`parse.loops`: stopped there by the embedded engines), replies cut at max_tokens
    for k, ok, qs, ctok, key, text in zip(*(gen_table.column(n).to_pylist() for n in ("cluster", "ok", "questions", "completion_tokens", "key", "text"))):
        stopped = ok and ctok >= cfg.llm.max_tokens_generate
        looped += bool(ok and loops(text or ""))
        at_cap += stopped
        for j, q in enumerate(qs):
            cand.setdefault(k, []).append(len(cand_text))
            cand_text.append(q)
            cand_cluster.append(k)
            cand_rank.append(j)
            cand_key.append(key)
            cand_stopped_last.append(stopped and j == len(qs) - 1)
    gen_failed = int(gdone["assemble"].get("failed", 0))
    del gen_table
    n_cand = len(cand_text)
    if n_cand == 0:
        raise RuntimeError("cqg: the LLM produced no usable question (see questions/generations.parquet and the llm ledger)")

    # 3. text filters (they drop, never rewrite), then probing (Equation 1) of the questions left
    copies = copies_of(run.root_uri, cand_text) if "copy" in c.filters else np.zeros(n_cand, bool)
    reasons = np.array(text_filters(cand_text, c.filters, c.max_question_words, copies, np.array(cand_stopped_last),
                                    example_questions(c)), dtype=object)
    to_probe = {k: [i for i in ids if not reasons[i]] for k, ids in cand.items()}
    log.info("cqg: text filters dropped %s of %d candidates", {f: int(np.sum(reasons == f)) for f in ("copy", "example", "long", "cut_off")},
             n_cand)
    run.write_table(f"{ctx.stage}/{PROBE_CANDIDATES}", pa.table({"candidate_id": np.arange(n_cand), "text": cand_text}))
    ptable = probe_plan(probes, to_probe, cl.doc_ids, places)
    per_row = float(np.mean([len(x) for x in ptable.column("question_index").to_pylist()])) if ptable.num_rows else 1.0
    groups = write_plan(run, f"{ctx.stage}/{PROBE_PLAN}", ptable, rows_per_group(per_row))
    log.info("cqg: %d candidate questions, %d probe texts", n_cand, ptable.num_rows)
    del ptable
    counts = {f"{r}_{k}": np.zeros(n_cand, np.int64) for r in ROLES for k in ("yes", "n")}
    pjob = ProbeJob(run.root_uri, ctx.stage, f"{c.method}-probe", cfg)
    pdone = stream_plan(pjob, groups, backend.identity if backend is not None else backend_identity(cfg.llm), backend=backend,
                        on_assembled=lambda part: fold_probe_counts(counts, part))
    neg_yes = counts["hard_yes"] + counts["easy_yes"]
    neg_n = counts["hard_n"] + counts["easy_n"]
    q = quality(counts["positive_yes"], counts["positive_n"], neg_yes, neg_n)
    if "own_cluster" in c.filters:
        denied = own_cluster_no(counts["positive_yes"], counts["positive_n"], c.own_cluster_share, q, c.own_cluster_quality)
        reasons[(reasons == "") & denied] = "own_cluster"

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
    run.write_table(QUESTION_EMBEDDINGS, question_embeddings_table(emb[kept], cfg.encode.model, cfg.encode.backend))

    gfit, pfit = fit_report(gdone["count"].get("fit", {})), fit_report(pdone["count"].get("fit", {}))
    for step, fit in (("generation", gfit), ("probe", pfit)):
        if fit["prompts_clipped"]:
            log.warning("cqg: %d of %d %s prompts clipped to fit the context: %d texts dropped, %d characters cut", fit["prompts_clipped"],
                        fit["prompts_checked"], step, fit["texts_dropped"], fit["chars_cut"])
    ctx.counts.update({
        "clusters": len(clusters), "generation_prompts": int(gdone["count"].get("requests", 0)), "generation_failed": gen_failed,
        "generation_looped": looped, "generation_at_cap": at_cap,
        "generated": n_cand + sum(dropped.values()), "parsed": n_cand, **{f"dropped_{k}": v for k, v in dropped.items()},
        "probe_prompts": int(pdone["count"].get("requests", 0)), "probe_failed": int(pdone["assemble"].get("failed", 0)),
        **{f"dropped_{f}": int(np.sum(reasons == f)) for f in ("copy", "example", "long", "cut_off", "own_cluster", "opening")},
        "probed": int(np.sum(~np.isnan(q))), "selected_top_t": int(len(chosen)), "deduped": int(len(chosen) - len(kept)), "questions": int(len(kept)),
        "mean_quality_selected": round(float(np.nanmean(q[kept])), 4) if len(kept) else None,
        **quality_medians(q, is_kept),
        **{f"generation_{k}": v for k, v in gfit.items()}, **{f"probe_{k}": v for k, v in pfit.items()},
    })
    ctx.extra["prompt_budget"] = budget_summary(budget)
    ctx.extra["prompt"] = prompt  # build.json names the generation prompt and the writer
    ctx.extra["writer"] = c.writer_model or None
    ctx.extra["llm"] = {"generate": gdone["llm"], "probe": pdone["llm"]}
    ctx.extra["wall_s"] = round(time.time() - t0, 1)
    run.write_json(f"{ctx.stage}/stats.json", {"counts": ctx.counts, "llm": ctx.extra["llm"]})
    from cqg_ray.cqg.report import write_report

    shown = sorted(set(cl_arr[kept].tolist()))[:3]  # the report shows three clusters' first positives
    first = {}
    for s in gen:
        first.setdefault(s.cluster, s)
    texts = load_texts(run, sorted({str(cl.doc_ids[i]) for k in shown if k in first for i in first[k].positives[:3]}))
    write_report(run, ctx.stage, cfg, candidates, texts, cl.doc_ids, gen, ctx.counts, ctx.extra["llm"], n_clusters_shown=3)

