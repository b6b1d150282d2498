"""The CQG stage end to end: orchestration with the scripted backend, then the real embedded LLM with a kill and a resume."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cqg_ray.config import stage_hash
from cqg_ray.rundir import RunDir, run_stage

from tests.conftest import LLM_THREADS, copy_clustered, small_config

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "CQG_RAY_PROGRESS": "0"}


TOPICS = ["apples", "rivers", "taxes", "music", "football", "weather", "elections", "cooking", "movies", "science", "war",
          "children", "money", "travel", "health", "law"]


def scripted(req):
    """Three distinct questions per generation prompt (topics chosen by the prompt), default answers otherwise."""
    from cqg_ray.llm.engines.fake import default_reply

    if req.n_answers is not None or req.yes_no:
        return default_reply(req)
    import hashlib

    h = int(hashlib.sha256(req.messages[-1]["content"].encode()).hexdigest(), 16)  # the cluster's own turn
    picks = [TOPICS[(h >> (4 * i)) % len(TOPICS)] for i in range(3)]
    return "Here are the questions:\n" + "\n".join(f"{i}. Does the text talk about {w} in detail number {i}?" for i, w in enumerate(picks, 1))


def test_cqg_probes_single_pass(clustered_run, corpus_file, tmp_path):
    """Single-pass probing: every candidate is asked on each of its cluster's probe texts, one prompt per pair (two
    candidates with the same text asked on the same probe text share one request)."""
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=3)
    assert cfg.llm.answer_mode == "single"
    run = RunDir(str(d))
    fake = FakeBackend(cfg.llm, reply=scripted)
    c = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))["counts"]
    probes = [r for r in fake.calls if r.yes_no]
    assert all(len(r.meta["question_ids"]) == 1 and r.answer_prefix == "1." for r in probes)
    rows = run.read_table("questions/probes.parquet").to_pylist()
    assert all(len(r["answers"]) == 1 for r in rows)
    cand = run.read_table("questions/candidates.parquet").to_pylist()
    assert c["probe_prompts"] == len(rows) == c["parsed"] * (2 + 1 + 1)
    sent = [json.dumps(r.messages) for r in probes]
    assert len(sent) == len(set(sent)) == len({(cand[q]["text"], r["doc_id"]) for r in rows for q in r["question_ids"]})
    assert all(r["positive_n"] == 2 and r["hard_n"] == 1 and r["easy_n"] == 1 for r in cand)


def test_replies_that_loop_are_counted(clustered_run, corpus_file, tmp_path):
    """A reply whose last two items repeat earlier ones (``parse.loops``: the embedded engines stop it there) counts in
    the manifest's generation_looped; its repeats are dropped as duplicates."""
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend, default_reply

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=2)
    run = RunDir(str(d))

    def reply(req):
        if req.yes_no:
            return default_reply(req)
        return "1. Is the text about a movie?\n2. Is the text about a comedy?\n3. Is the text about a movie?\n4. Is the text about a comedy?\n"

    fake = FakeBackend(cfg.llm, reply=reply)
    c = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))["counts"]
    assert (c["generation_prompts"], c["generation_looped"], c["generation_at_cap"]) == (2, 2, 0)
    assert (c["parsed"], c["dropped_duplicate"]) == (4, 4)
    assert all(r.stop_on_loop for r in fake.calls if not r.yes_no)  # every generation request asks the engines to stop a loop


def test_cqg_with_scripted_llm(clustered_run, corpus_file):
    from cqg_ray.artifacts import load_questions, load_texts
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend

    cfg = small_config(clustered_run, corpus_file, max_clusters=5, extra={"llm": {"answer_mode": "packed"}})
    run = RunDir(str(clustered_run))
    fake = FakeBackend(cfg.llm, reply=scripted)
    m = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False), force=True)
    c = m["counts"]
    assert c["clusters"] == 5
    assert c["generation_prompts"] == 5
    assert c["parsed"] + c["dropped_duplicate"] == 15  # the scripted LLM writes 3 questions per prompt
    assert c["probe_prompts"] == 5 * (2 + 1 + 1)  # one prompt per probe text, all of a cluster's questions in it
    assert c["questions"] == c["selected_top_t"] - c["deduped"]
    assert c["selected_top_t"] <= 5 * 2
    q = load_questions(run)
    assert q.column("question_id").to_pylist() == list(range(q.num_rows))
    qual = q.column("quality").to_numpy()
    assert np.all(qual[:-1] >= qual[1:])  # best first
    cand = run.read_table("questions/candidates.parquet")
    # Equation 1 recomputed from the stored counts
    row = cand.to_pylist()[0]
    assert row["quality"] == pytest.approx(row["positive_yes"] / row["positive_n"] - (row["hard_yes"] + row["easy_yes"]) / (row["hard_n"] + row["easy_n"]))
    samples = run.read_table("questions/samples.parquet")
    assert samples.num_rows == 5 * (3 + 4 + 3)
    ids = samples.column("doc_id").to_pylist()  # the prompts' texts are the samples' documents, each found in the corpus
    assert len(load_texts(run, ids)) == len(set(ids))
    for f in ("report.md", "quality_hist.png", "generations.parquet", "probes.parquet", "stats.json"):
        assert run.exists("questions", f)
    # a rerun takes every answer from the ledger: no LLM call at all
    fake2 = FakeBackend(cfg.llm, reply=scripted)
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake2, progress=False), force=True)
    assert fake2.calls == []
    assert load_questions(run).equals(q)


def test_written_for_more_clusters_the_stage_asks_only_for_the_clusters_added(clustered_run, corpus_file, tmp_path):
    """What the demo's top-up relies on (cqg_ray.sizing.top_up): a cluster's samples, prompt and probes depend on that
    cluster alone, so the stage run again for more clusters finds every earlier answer in the ledger and asks the LLM
    only the added clusters' generation prompts and their candidates' probes: exactly the distinct probes a fresh run for
    4 clusters asks, less those the run for 2 asked (two clusters' candidates can share a question's text and a probe
    text, one request for both)."""
    from cqg_ray.artifacts import load_questions
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend

    def questions(d, n):
        run = RunDir(str(d))
        cfg = small_config(d, corpus_file, max_clusters=n)
        fake = FakeBackend(cfg.llm, reply=scripted)
        counts = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))["counts"]
        return fake.calls, counts, run.read_table("questions/candidates.parquet").to_pylist()

    def probes(calls):
        return [json.dumps(r.messages) for r in calls if r.yes_no]

    d = copy_clustered(clustered_run, tmp_path / "run")
    first, c2, cand2 = questions(d, 2)
    added, c4, cand4 = questions(d, 4)
    fresh, c4_fresh, _ = questions(copy_clustered(clustered_run, tmp_path / "fresh"), 4)
    assert (c2["clusters"], c4["clusters"]) == (2, 4) and load_questions(RunDir(str(d))).num_rows == c4["questions"]
    assert c4 == c4_fresh
    gen = [r for r in added if not r.yes_no]
    assert len(gen) == 2 and {r.messages[-1]["content"] for r in gen}.isdisjoint(r.messages[-1]["content"] for r in first if not r.yes_no)
    assert len(probes(added)) == len(set(probes(added))) > 0 and len(probes(fresh)) == len(set(probes(fresh)))
    assert set(probes(added)) == set(probes(fresh)) - set(probes(first))
    assert len(probes(added)) <= c4["probe_prompts"] - c2["probe_prompts"]
    # the first two clusters' candidates and their probe counts are as before
    same = ("cluster", "text", "positive_yes", "positive_n", "hard_yes", "hard_n", "easy_yes", "easy_n")
    assert [{k: r[k] for k in same} for r in cand4[: len(cand2)]] == [{k: r[k] for k in same} for r in cand2]


def test_qaemb_method(clustered_run, corpus_file):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend

    # the fake's random answers would let the own-cluster filter drop every question; this test is about the A.2 plumbing
    cfg = small_config(clustered_run, corpus_file, max_clusters=2, method="qaemb", qaemb_articles=4, filters=["copy", "long", "cut_off"])
    run = RunDir(str(clustered_run / ".." / "qaemb"))
    copy_clustered(clustered_run, clustered_run / ".." / "qaemb")  # reuse the clustered run's folders
    fake = FakeBackend(cfg.llm)
    m = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))
    assert "Reference Articles" in fake.calls[0].messages[0]["content"]
    assert m["counts"]["generation_prompts"] == 2
    assert run.read_table("questions/questions.parquet").column("method").to_pylist()[0] == "qaemb"
    assert cfg.cqg.theta_value == 0.925


@pytest.mark.slow
def test_cqg_real_llm_killed_and_resumed(clustered_run, corpus_file, tmp_path):
    """A real LLM through llama.cpp (the bundled SmolLM2-135M: what is tested is the resume, which any model shows at a
    quarter of the 0.5B's work; the 0.5B runs every stage in tests/test_jobs.py): kill the stage in the middle of
    generation, run it again."""
    import yaml

    d = copy_clustered(clustered_run, tmp_path / "run")
    # two sequences decoded at a time, so the 3 generations finish in two waves and the kill lands between them;
    # 80 tokens hold ~5 questions (the last one may be cut off, which the filters drop). The resumed stage probes each
    # candidate on one positive and one hard negative: the point here is the resume, the probes' work is the model's
    # (own_cluster off: one positive probe saying no would drop a candidate; the filters are tested above). The property
    # prompt with one worked example (none: a small model answers instead of asking) and no keywords: what the model reads
    # is the generations' time. SmolLM2 against the 0.5B, alone on the AVX2 EPYC: 86 s against 107 s
    cfg = small_config(d, corpus_file, backend="llamacpp", max_clusters=3, questions_per_prompt=5, p_p=1, p_h=1, p_e=0, examples=1, keywords=0,
                       filters=["copy", "example", "long", "cut_off"],
                       extra={"llm": {"max_tokens_generate": 80, "llamacpp": {"model": "bundled:smollm2-135m", "n_ctx": 2048, "batch_generate": 2,
                                                           "n_threads": LLM_THREADS}}})
    cfgf = tmp_path / "c.yaml"
    cfgf.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    cmd = [sys.executable, "-m", "cqg_ray.cli", "cqg", "-c", str(cfgf)]
    log = open(tmp_path / "first.log", "wb")
    p = subprocess.Popen(cmd, env=ENV, start_new_session=True, stdout=log, stderr=log)
    from cqg_ray.llm.ledger import Ledger

    ledger = d / "llm" / "ledger" / "cqg-generate"
    finished = lambda: Ledger(RunDir(str(d)), "cqg-generate").columns(["key"]).num_rows  # noqa: E731  shards and workers' journals
    deadline = time.time() + 900
    while time.time() < deadline and finished() < 1:
        assert p.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.5)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(2)
    done_before = finished()
    assert 1 <= done_before < 3  # killed in the middle of generation
    assert not (d / "questions" / "_manifest.json").exists()
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    stats = json.loads((ledger / "_stats.json").read_text())
    last = stats["runs"][-1]
    assert last["requests"] == 3
    assert last["from_ledger"] >= done_before  # the finished generations were not asked again
    assert last["sent"] == 3 - last["from_ledger"]
    m = json.loads((d / "questions" / "_manifest.json").read_text())
    assert m["counts"]["parsed"] > 0
    assert m["counts"]["questions"] > 0
    run = RunDir(str(d))
    q = run.read_table("questions/questions.parquet").to_pylist()
    for row in q:
        assert row["text"].endswith("?")
        assert -1.0 <= row["quality"] <= 1.0


def test_filters_drop_copies_long_cut_off_and_questions_their_cluster_denies(clustered_run, corpus_file, tmp_path):
    """Each filter on a crafted question, counted in the stage report; the filters drop, they never rewrite."""
    from cqg_ray.artifacts import load_corpus
    from cqg_ray.cqg.quality import words as word_tokens
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.base import Completion
    from cqg_ray.llm.engines.fake import FakeBackend

    d = copy_clustered(clustered_run, tmp_path / "run")
    cfg = small_config(d, corpus_file, max_clusters=2, t=10)
    run = RunDir(str(d))
    tokens = next(w for w in map(word_tokens, load_corpus(run, ["text"]).column("text").to_pylist()) if len(w) >= 8)
    copy_q = f"Does the text say {' '.join(tokens[:6])}?"  # six words in a row of a corpus text
    long_q = "Is the text about " + " ".join(["a very long list of many different things"] * 3) + "?"
    cut_q = "Is the text about the?"
    denied_q = "Does the text describe a red umbrella?"
    good_q = "Does the text describe an everyday scene?"
    last_q = "Does the text discuss the weather"  # the reply stops on the token limit right after it

    def reply(req):
        if req.yes_no:
            question = req.messages[0]["content"].rsplit("1. ", 1)[1]
            return Completion("no" if question == denied_q else "yes", prompt_tokens=10, p_yes=[0.1 if question == denied_q else 0.9])
        text = "\n".join(f"{i}. {q}" for i, q in enumerate([copy_q, long_q, cut_q, denied_q, good_q, last_q], 1))
        return Completion(text, prompt_tokens=100, completion_tokens=cfg.llm.max_tokens_generate)

    fake = FakeBackend(cfg.llm, reply=reply)
    c = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))["counts"]
    assert (c["dropped_copy"], c["dropped_example"], c["dropped_long"], c["dropped_cut_off"], c["dropped_own_cluster"]) == (2, 0, 2, 4, 2)
    assert (c["generation_looped"], c["generation_at_cap"]) == (0, 2)  # both replies stopped on the token limit, neither looped
    cand = {r["text"]: r for r in run.read_table("questions/candidates.parquet").to_pylist()}
    assert cand[copy_q]["filtered"] == "copy" and cand[long_q]["filtered"] == "long"
    assert cand[cut_q]["filtered"] == "cut_off" and cand[last_q + "?"]["filtered"] == "cut_off" and cand[last_q + "?"]["stopped_last"]
    assert cand[denied_q]["filtered"] == "own_cluster" and cand[good_q]["filtered"] == ""
    probed = {r.messages[0]["content"].rsplit("1. ", 1)[1] for r in fake.calls if r.yes_no}
    assert probed == {denied_q, good_q}  # text filters run before probing: no probe is spent on what they drop
    assert run.read_table("questions/questions.parquet").column("text").to_pylist() == [good_q]  # dedup keeps one of the two clusters'
    report = run.read_bytes("questions/report.md").decode()
    assert "| dropped_copy | 2 |" in report and "## Eq. 1 quality of kept and dropped questions" in report
    assert "filters copy, example, long, cut_off, own_cluster" in report


def test_property_prompt_by_default_and_the_paper_prompt_verbatim(clustered_run, corpus_file, tmp_path):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.llm.prompts import PROPERTY_KEYWORDS_RULE, PROPERTY_SYSTEM

    for prompt in ("property", "paper"):
        d = copy_clustered(clustered_run, tmp_path / prompt)
        cfg = small_config(d, corpus_file, max_clusters=1, **({"prompt": prompt} if prompt == "paper" else {}))
        assert cfg.cqg.prompt == prompt
        fake = FakeBackend(cfg.llm, reply=scripted)
        m = run_stage(RunDir(str(d)), "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))
        assert m["prompt"] == prompt and m["writer"] is None
        gen = [r for r in fake.calls if not r.yes_no][0].messages
        if prompt == "paper":
            assert len(gen) == 1 and gen[0]["role"] == "user"
            assert gen[0]["content"].startswith("Generate 10 simple yet insightful yes/no questions that determine the properties of an article")
        else:
            assert [x["role"] for x in gen] == ["system"] + ["user", "assistant"] * 3 + ["user"]
            assert gen[0]["content"] == PROPERTY_SYSTEM + PROPERTY_KEYWORDS_RULE  # cqg.keywords is 10 by default
            assert gen[-1]["content"].startswith("Positive texts:\n1. ") and "\n\nWords typical of texts like the positives: " in gen[-1]["content"]


def test_cluster_keywords_reach_the_property_prompt(clustered_run, corpus_file, tmp_path):
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend

    d = copy_clustered(clustered_run, tmp_path / "kw")
    cfg = small_config(d, corpus_file, max_clusters=2, keywords=6)
    fake = FakeBackend(cfg.llm, reply=scripted)
    run = RunDir(str(d))
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=fake, progress=False))
    kw = run.read_table("questions/keywords.parquet").to_pylist()
    assert len(kw) == cfg.cluster.k and [r["cluster"] for r in kw] == list(range(cfg.cluster.k))
    assert all(0 < len(r["keywords"]) <= 6 for r in kw)
    gens = {r.meta["cluster"]: r.messages[-1]["content"] for r in fake.calls if not r.yes_no and r.n_answers is None}
    assert sorted(gens) == [0, 1]
    for k, content in gens.items():
        assert f"Words typical of texts like the positives: {', '.join(kw[k]['keywords'])}\n\n" in content


@pytest.mark.ray
def test_cqg_on_ray_streams_its_plans_and_equals_the_in_process_run(clustered_run, corpus_file, tmp_path, ray_local):
    """Generation and probing as plans answered by Ray Data workers: the same artifacts as in-process, and a rerun sends nothing."""
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.llm.ledger import Ledger

    extra = {"cqg": {"max_opening_share": 1.0}, "llm": {"flush_every": 50_000}}  # the fake LLM's questions share one opening
    runs = {}
    for where in ("ray", "local"):
        d = copy_clustered(clustered_run, tmp_path / where)
        cfg = small_config(d, corpus_file, max_clusters=4, extra=extra)
        backend = FakeBackend(cfg.llm) if where == "local" else None
        run = RunDir(str(d))
        counts = run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=backend, progress=False))["counts"]
        runs[where] = (run, counts)
    (ray_run, on_ray), (local_run, local) = runs["ray"], runs["local"]
    assert on_ray == local and on_ray["generation_prompts"] == 4 and on_ray["probe_prompts"] > 0 and on_ray["questions"] > 0
    for f in ("questions.parquet", "candidates.parquet", "generations.parquet", "probes.parquet", "keywords.parquet"):
        assert ray_run.read_table(f"questions/{f}").equals(local_run.read_table(f"questions/{f}")), f
    for stage in ("cqg-generate", "cqg-probe"):
        ledger = Ledger(ray_run, stage)
        assert len(ledger.shards()) == 1 and ledger.journals() == []  # the workers' journals, recovered into one shard
        assert ledger.read_stats()["runs"][-1]["sent"] == ledger.read_stats()["totals"]["requests"] > 0
    cfg = small_config(tmp_path / "ray", corpus_file, max_clusters=4, extra=extra)
    again = run_stage(ray_run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, progress=False), force=True)["counts"]
    assert again == on_ray
    assert [Ledger(ray_run, s).read_stats()["runs"][-1]["sent"] for s in ("cqg-generate", "cqg-probe")] == [0, 0]
