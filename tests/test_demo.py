"""`cqg-ray demo` prints each summary block once, with the copy rate against the run's own corpus (no Ray: the
pipeline is stood in for by the evaluation stage alone, on a toy run whose earlier stages are done)."""

import json
from dataclasses import asdict

import pytest

import cqg_ray.pipeline
from cqg_ray.config import dump_config

STS_PAIRS = [("A man is playing a guitar.", "A man plays the guitar.", 4.8), ("A dog runs in the park.", "A dog is running in a park.", 4.6),
             ("The bank raised interest rates.", "Interest rates were raised by the bank.", 4.4),
             ("A woman is cooking dinner.", "A woman is preparing a meal.", 3.9), ("A child reads a book.", "A kid is reading.", 3.2),
             ("The phone has a big screen.", "The laptop is heavy.", 1.4), ("A cat sleeps on the sofa.", "Stocks fell sharply on Monday.", 0.2),
             ("A man walks down the street.", "The orchestra played a symphony.", 0.0)]


L40 = {"label.n_cluster": 20, "label.n_neighbor": 12, "label.n_random": 8}  # the demo's texts labelled a question (20 + 12 + 8), then the sizing's fewer
L30 = {"label.n_cluster": 15, "label.n_neighbor": 9, "label.n_random": 6}

def test_the_demo_prints_the_summary_once_with_a_copy_rate(tmp_path, monkeypatch, capsys, toy_encoder):
    """The first demo runs the evaluation stage (which prints the tables), the second finds it done (the demo prints
    them): each time the STS table and the question-quality block appear once, the copy rate measured against the
    run's prepared corpus (the model folder has no run_config.yaml)."""
    from cqg_ray.demo import run_demo
    from cqg_ray.evaluate.report import TASK_TITLES
    from tests.conftest import toy_run

    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in STS_PAIRS))
    cfg = toy_run(tmp_path / "run", toy_encoder, {"evaluate": {"tasks": ["sts"], "sts": [str(sts)], "baselines": ["dense"],
                                                                "tau_sweep": [0.5], "m_sweep": [2], "active_k": [2]}})
    (tmp_path / "demo.yaml").write_text(dump_config(cfg))
    ran = []

    def pipeline(cfg, until=None, **kwargs):  # the stages before the evaluation are done; Ray is not started
        if until in ("cluster", "questions"):  # the demo's first calls: the stages before the sizing, then up to the questions
            return {}
        ran.append(cfg.run_dir)
        return {"evaluation": cqg_ray.pipeline.run_one(cfg, "evaluation")}

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", pipeline)
    manifests = []
    for attempt in ("evaluated", "resumed"):
        assert run_demo(str(tmp_path / "demo.yaml")) == 0
        out = capsys.readouterr().out
        assert out.count(TASK_TITLES["sts"]) == 1, (attempt, out)
        assert out.count("Question quality of ") == 1 and out.count("copy_rate: ") == 1, (attempt, out)
        assert "copy_rate: 0.2500   (share sharing a run of 6 words with a corpus text)" in out, (attempt, out)
        assert out.count("(full report with the load frontier") == 1 and "Two explanations (STS-B test pairs):" in out
        manifests.append((tmp_path / "run" / "evaluation" / "_manifest.json").read_text())
    assert ran == [str(tmp_path / "run")] * 2 and manifests[0] == manifests[1]  # the second demo skipped the stage


def test_the_demo_asks_each_stage_once(tmp_path, monkeypatch, capsys, toy_encoder):
    """The demo runs the pipeline in steps (before the sizing, up to the questions, the rest): each stage is run, or
    found done and logged as skipped, once a demo, not once a step ("questions: done (skipped)" printed twice)."""
    from cqg_ray.demo import run_demo
    from cqg_ray.rundir import RunDir
    from cqg_ray.stages import NAMES
    from tests.conftest import toy_run

    cfg = toy_run(tmp_path / "run", toy_encoder, {"evaluate": {"tasks": ["sts"], "sts": [], "baselines": []}})
    (tmp_path / "demo.yaml").write_text(dump_config(cfg))
    asked = []

    def run_one(cfg, name, force=False):  # Ray is not started; the toy run's stages are done
        asked.append(name)
        return RunDir(cfg.run_dir).manifest(name)

    monkeypatch.setattr(cqg_ray.pipeline, "init_ray", lambda ray_cfg: None)
    monkeypatch.setattr(cqg_ray.pipeline, "run_one", run_one)
    for attempt in ("first", "resumed"):
        asked.clear()
        assert run_demo(str(tmp_path / "demo.yaml")) == 0, attempt
        assert asked == list(NAMES), (attempt, asked)
    capsys.readouterr()


# ------------------------------------------------------------------ sizing to the machine
def demo_config(tmp_path, **cqg):
    from cqg_ray.config import load_config

    return load_config("demo", [f"run_dir={tmp_path / 'run'}", *(f"cqg.{k}={v}" for k, v in cqg.items())])


def test_the_demo_keeps_its_floor_of_questions_through_the_reliability_drop():
    """The sizing's floor (MIN_QUESTIONS, at the measured yield a cluster) is also the model stage's min_kept: on a Zen 5
    the rule dropped 11 of 28 questions (select AUC on ~6 labels each), which would have left 17 in the model."""
    from cqg_ray.config import load_config
    from cqg_ray.demo import MIN_QUESTIONS
    from cqg_ray.mbqa.stage import reliability_rules

    cfg = load_config("demo")
    assert cfg.train.min_kept == MIN_QUESTIONS == 20 and reliability_rules(cfg).min_kept == 20
    assert load_config("paper").train.min_kept == 0  # elsewhere the rule alone decides


def test_a_fast_machine_keeps_the_whole_demo():
    from cqg_ray.config import load_config
    from cqg_ray.demo import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    assert cfg.cqg.max_clusters is None  # the sizing decides how many of the 30 clusters questions are written for
    sized, reason = size_demo(cfg, Rates(read=5000, write=500, pairs=500), 600)
    assert sized == {"cqg.max_clusters": 30, "cqg.p_p": 10, "cqg.p_h": 6, "cqg.p_e": 4, "cqg.n_h": 18, "cqg.n_e": 18, **L40}
    assert reason.startswith("30 of 30 clusters, probes 10/6/4 a question, 18 + 18 negatives a prompt, 40 texts labelled a question: "
                             "about ") and "fits (10 min;" in reason


def test_the_reason_says_where_the_host_changed_speed_under_the_measurement():
    from cqg_ray.config import load_config
    from cqg_ray.demo import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    for steady in (1.05, 0.84, 1.29, None):  # within HOST_CHANGE (1.3x), or not timed
        assert size_demo(cfg, Rates(read=5000, write=500, pairs=500, host_speed=steady), 600)[1].endswith("answerer 500.0 pairs/s)")
    _, reason = size_demo(cfg, Rates(read=5000, write=500, pairs=500, host_speed=2.35), 600)
    assert reason.endswith("answerer 500.0 pairs/s; the host ran 2.35x as fast after the writer's timings as during them: "
                           "all rates at the slower)")


def test_the_encode_stages_pace_is_read_where_it_encoded_every_text_now(tmp_path):
    from cqg_ray.demo import encode_pace
    from cqg_ray.rundir import MANIFEST, RunDir

    run = RunDir(str(tmp_path / "run"))
    assert encode_pace(run) is None  # no encode yet
    counts = {"documents": 3000, "encoded_now": 3000, "unit_seconds": 4.11, "corpus_bytes": 295596}
    run.write_json(f"encode/{MANIFEST}", {"stage": "encode", "counts": counts, "seconds": 7.5})
    assert encode_pace(run) == 71921.2  # the Intel AMX host's demo of 2026-12-06 that measured its rates
    run.write_json(f"encode/{MANIFEST}", {"stage": "encode", "counts": {**counts, "encoded_now": 1000}, "seconds": 3.0})
    assert encode_pace(run) is None  # resumed: its unit-seconds cover a part of the bytes


def test_generation_is_sized_as_the_writer_works_through_its_calls():
    """generation_s: every prompt's own tokens read, the common prefix once a wave, and LONGEST_REPLY_TOKENS decoding
    steps a wave, a step of b sequences taking the timed step (write_batch / write) and DECODE_TOKEN_COST tokens'
    reading for each sequence beyond the timed batch; calls of GENERATE_ROWS prompts."""
    from cqg_ray.cqg.stage import GENERATE_ROWS
    from cqg_ray.demo import DECODE_TOKEN_COST, LONG_PROMPT_READ, LONGEST_REPLY_TOKENS, SHARED_PROMPT_TOKENS, generation_s
    from cqg_ray.llm.rates import Rates

    assert (GENERATE_ROWS, LONGEST_REPLY_TOKENS, SHARED_PROMPT_TOKENS, DECODE_TOKEN_COST) == (16, 150, 691, 1.5)
    r = Rates(read=200, write=40, pairs=1, write_batch=4)  # a step of 4 sequences: 0.1 s; each further sequence 1.5/200 s
    # one call of 16: 16 x 984 / 200 = 78.72 s read, the prefix 3.455 s, 150 steps of 0.1 + 12 x 0.0075 = 0.19 s
    assert generation_s(16, 984, r, 32) == pytest.approx(78.72 + 3.455 + 28.5)
    # 17: a second call of one sequence, its prefix read again and 150 steps of the timed 0.1 s (fewer sequences than
    # timed are not counted cheaper)
    assert generation_s(17, 984, r, 32) == pytest.approx(17 * 4.92 + 2 * 3.455 + 28.5 + 15.0)
    # decoded 8 at a time: two waves of 8 in the call, each its prefix and 150 steps of 0.1 + 4 x 0.0075 = 0.13 s
    assert generation_s(16, 984, r, 8) == pytest.approx(78.72 + 2 * 3.455 + 2 * 19.5)
    # rates kept before the write rate was timed over a batch: one sequence's step, 1 / write
    assert generation_s(16, 984, Rates(read=200, write=40, pairs=1), 32) == pytest.approx(78.72 + 3.455 + 150 * (0.025 + 15 * 0.0075))
    assert generation_s(0, 984, r, 32) == 0.0
    # prompt tokens read at read_speed of the timed rate: at half of it every read and each further sequence's share of a
    # step take twice as long
    assert generation_s(16, 984, r, 32, read_speed=0.5) == pytest.approx(2 * 78.72 + 2 * 3.455 + 150 * (0.1 + 12 * 0.015))
    # llama.cpp under the AVX2 cap on an Intel AMX host (2026-12-06; its rates 100.85 read, 17.10 written by 4):
    # `bench/generate.py --demo --prompts 16` read 19,569 prompt tokens (the 691 of the prefix once) and took 334.9 s;
    # the rule at its LONG_PROMPT_READ gives 321.9 s, at the rate timed on a short prompt 255.9 s
    ll, own = Rates(read=100.85, write=17.10, pairs=6.4, write_batch=4), (19_569 - 691) / 16
    assert LONG_PROMPT_READ == {"llamacpp": 0.77, "torch-bfloat16 without AMX": 0.75}
    assert generation_s(16, own, ll, 32, LONG_PROMPT_READ["llamacpp"]) == pytest.approx(334.9, rel=0.05)
    assert generation_s(16, own, ll, 32) == pytest.approx(255.9, abs=0.1)
    # the demos measured stage by stage, within a tenth: on an Intel AMX host (2026-12-06, torch-bfloat16: its rates
    # 206.3 read, 14.1 written by 4) 24 property prompts at 18 + 18 negatives took 210.0 s (the rule: 223.7); on the
    # AVX2 EPYC Zen 3 (2026-12-02: 47 read, 6.2 written by 4) 10 prompts at 6 + 6 negatives (24 texts fewer at 23
    # tokens) 232.4 s (the rule: 232.1)
    amx = Rates(read=206.274, write=14.107, pairs=31.2, write_batch=4)
    assert generation_s(24, 984, amx, 32) == pytest.approx(210.0, rel=0.1)
    # torch-bfloat16 without AMX, on Zen 4 (AVX-512-BF16): 16 prompts read 19,291 tokens (597 of a shared prefix once)
    # and took 212.4 s (`bench/generate.py --demo --prompts 16 --batch 16`, 2026-12-07; rates 130.4 read, 34.14 by 4),
    # and a demo's 16 read ~16.9k after the prefix in 259.7 s (2026-12-01; rates 138 read, 26.2 by 4): the rule at 0.75
    # gives 243 and 219 s, at the timed rate 187 and 170
    assert generation_s(10, 984 - 24 * 23, Rates(read=47, write=6.2, pairs=6.8, write_batch=4), 32) == pytest.approx(232.4, rel=0.1)
    zen4 = LONG_PROMPT_READ["torch-bfloat16 without AMX"]
    assert generation_s(16, (19_291 - 597) / 16, Rates(read=130.4, write=34.14, pairs=22, write_batch=4), 32, zen4) == pytest.approx(212.4, rel=0.15)
    assert generation_s(16, 16_900 / 16, Rates(read=138, write=26.2, pairs=24, write_batch=4), 32, zen4) == pytest.approx(259.7, rel=0.2)
    assert generation_s(16, 16_900 / 16, Rates(read=138, write=26.2, pairs=24, write_batch=4), 32) == pytest.approx(170, rel=0.01)


def test_the_long_prompt_share_follows_the_engine_and_the_cpu():
    from cqg_ray.demo import long_prompt_read

    assert long_prompt_read("torch-bfloat16", {"avx512_bf16", "amx_bf16", "amx_tile"}) == 1.0  # Intel AMX: as timed
    assert long_prompt_read("torch-bfloat16", {"avx512_bf16", "avx512f"}) == 0.75  # AMD Zen 4 / Zen 5
    assert long_prompt_read("llamacpp", {"avx2"}) == 0.77
    assert long_prompt_read("torch-float32", {"avx2"}) == 1.0


def test_a_slow_machine_drops_clusters_then_probes_then_negatives_and_keeps_the_floor():
    from cqg_ray.config import load_config
    from cqg_ray.demo import (DECODE_TOKEN_COST, LABEL_PAIRS_SPEED, PROBE_PAIRS_SPEED, PROMPT_TOKENS, REST_S, SHARED_PROMPT_TOKENS,
                              TEXT_TOKENS, floor_clusters, size_demo)
    from cqg_ray.llm.rates import Rates

    # the floor of 20 questions: 16 clusters at the demo's and the paper's probes (1.3 questions a cluster), 10 at the
    # fewest (2.0: more questions pass the own_cluster filter on 3 positive probes); probes between levels take the
    # yield of the level below them, fewer than the fewest that level's; never below 20 / t. The sizing keeps 16
    # clusters (the floor at the demo's probes) until the probes, negatives and labels are at their fewest
    assert [floor_clusters(p, 4) for p in ((10, 6, 4), (5, 3, 2), (3, 2, 1), (10, 6, 1), (30, 0, 0), (1, 1, 1))] == [16, 16, 10, 16, 16, 10]
    assert floor_clusters((3, 2, 1), 1) == 20
    floor = 10
    wide = load_config("demo")  # all 30 clusters open to the sizing
    assert (PROMPT_TOKENS, SHARED_PROMPT_TOKENS, REST_S, TEXT_TOKENS) == (1675, 691, 40.0, 23)
    assert (DECODE_TOKEN_COST, PROBE_PAIRS_SPEED, LABEL_PAIRS_SPEED) == (1.5, 1.1, 0.75)
    # at 200 prompt tokens/s read, 40 written (one sequence: a step 1/40 s, each further sequence 1.5/200 s) and 20
    # pairs/s: 29 clusters are two calls (16 + 13): reading 29 x 984/200 = 142.68 s, the prefix twice (6.91 s), 150
    # steps of 0.1375 s and 150 of 0.115 s (37.875 s); probes 10 x 20 pairs a cluster at 20 x 1.1 pairs/s and labels
    # 1.3 x 40 (the questions it ends with) at 20 x 0.75, 29 x 12.558 = 364.17 s; with REST_S 591.6 s. 30 clusters
    # take 610.2 s, over the budget
    gen = 29 * (PROMPT_TOKENS - SHARED_PROMPT_TOKENS) / 200 + 2 * SHARED_PROMPT_TOKENS / 200 + 150 * (0.1375 + 0.115)
    assert REST_S + gen + 29 * (10 * 20 / 1.1 + 1.3 * 40 / 0.75) / 20 == pytest.approx(591.63, abs=0.01)
    sized, reason = size_demo(wide, Rates(read=200, write=40, pairs=20), 600)
    assert sized == {"cqg.max_clusters": 29, "cqg.p_p": 10, "cqg.p_h": 6, "cqg.p_e": 4, "cqg.n_h": 18, "cqg.n_e": 18, **L40}
    assert reason.startswith("29 of 30 clusters, probes 10/6/4") and "about 9.9 min expected, fits (10 min;" in reason
    # at 8 pairs/s the demo's probes would leave 14 (570.2 s; 15 take 607.7), under the floor: the paper's probes
    # (10 x 10 pairs a cluster) keep 21 (599.7 s; 22 take 625.8)
    sized, _ = size_demo(wide, Rates(read=200, write=40, pairs=8), 600)
    assert sized == {"cqg.max_clusters": 21, "cqg.p_p": 5, "cqg.p_h": 3, "cqg.p_e": 2, "cqg.n_h": 18, "cqg.n_e": 18, **L40}
    # too slow for the floor: the fewest probes, negatives and labels on the floor's clusters, and the reason says it
    # does not fit
    sized, reason = size_demo(wide, Rates(read=10, write=2, pairs=1), 600)
    assert sized == {"cqg.max_clusters": floor, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L30}
    assert "6 + 6 negatives a prompt, 30 texts labelled a question" in reason and "does not fit; this is the floor" in reason
    # fewer negatives where they buy the fit: at 30 prompt tokens/s read, 20 written and 40 pairs/s, 16 clusters at probes
    # 3/2/1 take 772.3 s with 18 + 18 negatives and 551.5 s with 9 + 9 (each text 23 of a prompt's tokens); 17 would
    # take 605.1
    sized, reason = size_demo(wide, Rates(read=30, write=20, pairs=40), 600)
    assert sized == {"cqg.max_clusters": 16, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 9, "cqg.n_e": 9, **L40} and "fits" in reason
    capped, _ = size_demo(load_config("demo", ["cqg.max_clusters=12"]), Rates(read=30, write=20, pairs=40), 600)
    # a config's own max_clusters caps it: 12 clusters fit at the paper's probes and 18 + 18 negatives (9.9 min)
    assert capped == {"cqg.max_clusters": 12, "cqg.p_p": 5, "cqg.p_h": 3, "cqg.p_e": 2, "cqg.n_h": 18, "cqg.n_e": 18, **L40}
    # fewer labels last, and with them clusters below 16: at 6 + 6 negatives 16 clusters take 477.9 s with 40 texts
    # labelled a question and 467.3 s with 30, over 430; 14 with 30 take 416.7 s (15: 442.0)
    sized, reason = size_demo(wide, Rates(read=30, write=20, pairs=40), 430)
    assert sized == {"cqg.max_clusters": 14, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L30}
    assert "30 texts labelled a question: about 6.9 min expected, fits" in reason
    # the faster AVX2 EPYC's rates of 2026-11-27 (56 prompt tokens/s read, 18.7 written, 10.2 pairs/s): 9 + 9 negatives,
    # 17 clusters
    sized, reason = size_demo(wide, Rates(read=56, write=18.7, pairs=10.2), 600)
    assert sized == {"cqg.max_clusters": 17, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 9, "cqg.n_e": 9, **L40}
    assert reason.startswith("17 of 30 clusters") and "about 9.7 min expected, fits" in reason
    # the same rates with a writer that reads the long prompts at 0.77 of the timed rate (llama.cpp): 6 + 6 negatives
    sized, reason = size_demo(wide, Rates(read=56, write=18.7, pairs=10.2), 600, read_speed=0.77)
    assert sized == {"cqg.max_clusters": 16, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L40}
    assert "about 9.3 min expected, fits (10 min; writer 56 prompt tokens/s read (0.77 of it on long prompts), 18.7 written" in reason
    # the budget's time already spent and the engines' loads count: the AVX2 EPYC Zen 3 of 2026-12-02 (47 read, 6.2
    # written, 6.8 pairs/s) fits 15 clusters on the whole budget (580.6 s; 16 take 614.3), but after 178 s of measuring
    # and stages before the questions, and 36 s of engine loads still to come, its floor: 214 + 411.8 = 625.8 s
    zen3 = dict(read=47, write=6.2, pairs=6.8)
    sized, reason = size_demo(wide, Rates(**zen3), 600)
    assert sized == {"cqg.max_clusters": 15, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L30}
    assert "about 9.7 min expected, fits" in reason
    sized, reason = size_demo(wide, Rates(**zen3), 600, spent_s=178, loads_s=36)
    assert sized == {"cqg.max_clusters": floor, "cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L30}
    assert "about 10.4 min expected (178 s of them spent before the questions), does not fit; this is the floor" in reason
    # keys the user set stay: only the others are sized, and set probes are not lowered
    sized, _ = size_demo(wide, Rates(read=200, write=40, pairs=5), 600, frozenset({"cqg.max_clusters"}))
    assert sized == {"cqg.p_p": 3, "cqg.p_h": 2, "cqg.p_e": 1, "cqg.n_h": 6, "cqg.n_e": 6, **L30}  # 30 clusters fit at no level: the fewest
    rates = Rates(read=200, write=40, pairs=8)
    sized, _ = size_demo(wide, rates, 600, frozenset({"cqg.p_p"}))
    assert sized == {"cqg.max_clusters": 16, "cqg.p_h": 6, "cqg.p_e": 4, "cqg.n_h": 6, "cqg.n_e": 6, **L30}  # set probes stay; negatives go
    sized, _ = size_demo(wide, rates, 600, frozenset({"cqg.n_e"}))
    assert sized["cqg.n_h"] == 18 and "cqg.n_e" not in sized  # set negatives are not lowered


def test_the_sizing_is_decided_once_per_run_directory_and_set_keys_win(tmp_path, monkeypatch, capsys):
    """A first demo measures (here: a stand-in for the engines) and writes demo_sizing.json; the config the pipeline
    runs carries the sized keys, except those --set gives; a second demo on the same directory measures nothing and
    keeps the sizing, whatever the rates say now."""
    import cqg_ray.demo as demo
    import cqg_ray.llm.rates as rates
    from cqg_ray.rundir import RunDir

    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "cache"))
    measured, ran = [], []
    def measure(w, a, keep=None, answer_read=True):
        measured.append(1)
        return rates.Rates(read=50, write=10, pairs=6, answer_read=90 if answer_read else None, write_batch=4, writer_load=10,
                           answerer_load=5, host_speed=1.0 if keep else None)  # keep: the writer's read is timed again

    monkeypatch.setattr(rates, "measure_rates", measure)

    def pipeline(cfg, until=None, **kwargs):  # the stages themselves are not run
        if until == "cluster":  # the stages before the questions, before the sizing (the unsized config)
            assert cfg.cqg.max_clusters is None and not RunDir(cfg.run_dir).exists(demo.SIZED)
            return {}
        ran.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", pipeline)
    sets = [f"run_dir={tmp_path / 'run'}", "cqg.p_e=1"]
    for _ in range(2):
        try:
            demo.run_demo("demo", sets)
        except SystemExit:
            pass
    record = RunDir(str(tmp_path / "run")).read_json(demo.SIZED)
    assert measured == [1] and record["rates_from"] == "measured now"
    # the sizing does not use the answerer's long-prompt read (`cqg-ray plan` does): the demo does not time it
    assert record["rates"] == {"read": 50, "write": 10, "pairs": 6, "answer_read": None, "write_batch": 4, "writer_load": 10,
                               "answerer_load": 5, "host_speed": 1.0, "pace": None}  # no encode manifest: no pace
    # p_e was set: the probes stay, and the negatives and labels are lowered instead
    assert record["overrides"] == {"cqg.max_clusters": 16, "cqg.p_p": 10, "cqg.p_h": 6, "cqg.n_h": 6, "cqg.n_e": 6, **L30}
    assert [(c.cqg.max_clusters, c.cqg.p_p, c.cqg.p_h, c.cqg.p_e, c.label.n_cluster) for c in ran] == [(16, 10, 6, 1, 15)] * 2
    out = capsys.readouterr().out
    assert out.count("demo sizing: 16 of 30 clusters, probes 10/6/1 a question") == 2
    # the first demo says it measures before the models load, and how long it took; the second measures nothing
    assert out.count("demo sizing: measuring this machine's LLM rates, once") == 1 and out.count("demo sizing: rates measured in") == 1
    assert out.index("measuring this machine's LLM rates") < out.index("rates measured in") < out.index("16 of 30 clusters")
    # another run directory on this machine reuses the measured rates
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: (_ for _ in ()).throw(AssertionError("measured again")))
    other = demo_config(tmp_path / "b")
    record = demo.demo_sizing(other, [], 10)
    assert record["rates_from"].startswith("measured earlier on this machine")
    # where the long-prompt read is asked for (`cqg-ray plan --measure`), rates kept without it are measured again
    monkeypatch.setattr(rates, "measure_rates", measure)
    from cqg_ray.cqg.stage import writer_llm

    assert rates.machine_rates(writer_llm(other), other.llm) == (rates.Rates(50, 10, 6, 90, 4, 10, 5), "measured now") and measured == [1, 1]
    # kept per engine as resolved: where `auto` picks another engine (another CPU kind, a changed rule) they are measured anew
    import cqg_ray.llm.base as base

    monkeypatch.setattr(base, "resolve_engine", lambda name, flags=None, work="score": "llamacpp")
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: measured.append(2) or rates.Rates(
        read=40, write=8, pairs=4, answer_read=70, write_batch=4, writer_load=10, answerer_load=5, host_speed=1.0))
    record = demo.demo_sizing(demo_config(tmp_path / "c"), [], 10)
    assert record["rates_from"] == "measured now" and measured == [1, 1, 2]
    assert "writer 40 prompt tokens/s read (0.77 of it on long prompts)" in record["reason"]  # llama.cpp's LONG_PROMPT_READ
    # rates kept before the write rate was timed over a batch (no write_batch) are measured again
    path = tmp_path / "cache" / "demo-rates.json"
    kept = json.loads(path.read_text())
    path.write_text(json.dumps({k: {f: v for f, v in r.items() if f != "write_batch"} for k, r in kept.items()}))
    assert demo.demo_sizing(demo_config(tmp_path / "d"), [], 10)["rates_from"] == "measured now" and measured == [1, 1, 2, 2]
    # and so are rates kept before the engines' loads were timed
    kept = json.loads(path.read_text())
    path.write_text(json.dumps({k: {f: v for f, v in r.items() if f != "answerer_load"} for k, r in kept.items()}))
    assert demo.demo_sizing(demo_config(tmp_path / "e"), [], 10)["rates_from"] == "measured now" and measured == [1, 1, 2, 2, 2]
    # and rates kept before the writer's read was timed again after the answerer's (no host_speed), by the demo, which
    # keeps the writer loaded and so can time it
    kept = json.loads(path.read_text())
    path.write_text(json.dumps({k: {f: v for f, v in r.items() if f != "host_speed"} for k, r in kept.items()}))
    assert demo.demo_sizing(demo_config(tmp_path / "g"), [], 10)["rates_from"] == "measured now" and measured == [1, 1, 2, 2, 2, 2]


def test_top_up_writes_for_the_clusters_that_give_the_floor_at_the_runs_own_yield():
    from cqg_ray.demo import MIN_QUESTIONS, top_up

    sized = {"overrides": {"cqg.max_clusters": 10, "cqg.p_p": 3}, "reason": "10 of 30 clusters", "rates": {"read": 50}}
    made = lambda n, q: {"counts": {"clusters": n, "questions": q}}  # noqa: E731  a questions manifest
    assert MIN_QUESTIONS == 20
    more = top_up(sized, made(10, 15), 30)  # 1.5 a cluster: 20 questions take ceil(10 x 20 / 15) = 14 clusters
    assert more == {"overrides": {"cqg.max_clusters": 14, "cqg.p_p": 3}, "rates": {"read": 50}, "topped_up": [{"clusters": 10, "questions": 15}],
                    "reason": "10 of 30 clusters; topped up to 14 clusters (15 questions from 10, under 20)"}
    assert sized["overrides"]["cqg.max_clusters"] == 10  # the record given is left as it was
    again = top_up(more, made(14, 19), 30)  # at least one more; the earlier top-ups stay listed
    assert again["overrides"]["cqg.max_clusters"] == 15 and again["topped_up"] == [{"clusters": 10, "questions": 15}, {"clusters": 14, "questions": 19}]
    assert top_up(sized, made(10, 0), 30)["overrides"]["cqg.max_clusters"] == 30  # none at all: every cluster (at most k)
    assert top_up(sized, made(10, 0), 12)["overrides"]["cqg.max_clusters"] == 12
    # nothing is added: enough questions, all k clusters written for, no questions stage, clusters set by --set (not in
    # the overrides), a run not sized (no rates)
    assert top_up(sized, made(10, 20), 30) is None and top_up(sized, made(30, 5), 30) is None and top_up(sized, None, 30) is None
    # asked for 30 where the clustering left 28 (empty clusters removed): the stage wrote for all there are
    assert top_up({**sized, "overrides": {"cqg.max_clusters": 30}}, made(28, 5), 30) is None
    assert top_up({**sized, "overrides": {"cqg.p_p": 3}}, made(10, 5), 30) is None
    assert top_up({"overrides": {"cqg.max_clusters": 16}, "reason": "not sized (its questions were written before)"}, made(16, 5), 30) is None


def test_a_demo_left_under_the_floor_says_why_no_more_clusters_are_written():
    from cqg_ray.demo import short_note

    sized = {"overrides": {"cqg.max_clusters": 10}, "reason": "10 of 30 clusters", "rates": {"read": 50}}
    made = lambda n, q: {"counts": {"clusters": n, "questions": q}}  # noqa: E731  a questions manifest
    assert short_note(sized, made(10, 20), 30, frozenset()) is None and short_note(sized, None, 30, frozenset()) is None
    assert short_note({**sized, "overrides": {}}, made(4, 6), 30, frozenset({"cqg.max_clusters"})) == (
        "demo sizing: 6 questions from 4 clusters, under the floor of 20, and no more are written: cqg.max_clusters is set "
        "(--set), which the sizing leaves as it is")  # it went on without a word
    assert short_note(sized, made(30, 12), 30, frozenset()).endswith(": every cluster there is was written for")
    assert short_note({**sized, "overrides": {"cqg.max_clusters": 30}}, made(28, 12), 30, frozenset()).endswith(
        ": every cluster there is was written for")  # the clustering left 28 of the 30 asked for
    unsized = {"overrides": {}, "reason": "not sized (--minutes 0): the config as it is"}
    assert short_note(unsized, made(8, 12), 30, frozenset()).endswith("no more are written: not sized (--minutes 0)")


def test_the_demo_tops_up_its_clusters_until_the_floor_and_a_resume_keeps_them(tmp_path, monkeypatch, capsys):
    """A demo whose questions stage ends under MIN_QUESTIONS writes for more clusters (here a stand-in for the stage
    gives 1.5 questions a cluster: 10 clusters 15 questions, then 14 give 21), records it in demo_sizing.json and
    runs the rest on the topped-up config; a resumed demo finds the questions done and adds nothing."""
    import cqg_ray.demo as demo
    import cqg_ray.llm.rates as rates
    from cqg_ray.rundir import RunDir, run_stage

    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: rates.Rates(read=10, write=2, pairs=1, answer_read=20, write_batch=4,
                                                                          writer_load=10, answerer_load=5))
    monkeypatch.setattr(demo, "LONG_PROMPT_READ", {})  # the reason below, whichever writer engine `auto` picks on this CPU
    calls, engines = [], []
    from cqg_ray.cqg.stage import writer_llm
    from cqg_ray.llm.backends import kept_backend
    from cqg_ray.llm.base import backend_identity

    def kept(cfg):  # (the writer's engine kept in this process, the answerer's)
        return tuple(kept_backend(backend_identity(llm)) is not None for llm in (writer_llm(cfg), cfg.llm))

    def pipeline(cfg, until=None, **kwargs):  # the questions stage alone, standing in; the rest is not run
        n = cfg.cqg.max_clusters
        calls.append((until, n))
        engines.append(kept(cfg))
        if until == "cluster":  # the stages before the questions (before the sizing)
            return {}
        run_stage(RunDir(cfg.run_dir), "questions", f"clusters-{n}", lambda ctx: ctx.counts.update(clusters=n, questions=n * 3 // 2), deps=[])
        if until is None:
            raise SystemExit(0)

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", pipeline)
    for _ in range(2):
        with pytest.raises(SystemExit):
            demo.run_demo("demo", [f"run_dir={tmp_path / 'run'}"])
    assert calls == [("cluster", None), ("questions", 10), ("questions", 14), (None, 14), ("questions", 14), (None, 14)]
    # the stages answer with the demo's engines, kept in this process: both while questions are written, the answerer
    # alone after them; none once the demo ends (here by the stand-in's exit)
    assert engines == [(False, False), (True, True), (True, True), (False, True), (True, True), (False, True)]
    assert kept(demo_config(tmp_path / "run")) == (False, False)
    record = RunDir(str(tmp_path / "run")).read_json(demo.SIZED)
    assert record["overrides"]["cqg.max_clusters"] == 14 and record["topped_up"] == [{"clusters": 10, "questions": 15}]
    assert record["reason"].endswith("does not fit; this is the floor (10 min; writer 10 prompt tokens/s read, 2.0 written by 4 sequences "
                                     "together; answerer 1.0 pairs/s); topped up to 14 clusters (15 questions from 10, under 20)")
    out = capsys.readouterr().out
    assert out.count("demo sizing: 15 questions from 10 clusters, under the floor of 20: writing for 14 (the first 10 clusters' LLM "
                     "answers are kept in the ledger)") == 1
    assert out.count("demo sizing: 10 of 30 clusters") == 2 and out.count("cqg.max_clusters=14") == 1  # the resume prints the record


def test_a_run_whose_questions_are_written_or_another_backend_is_not_sized(tmp_path, monkeypatch):
    import cqg_ray.demo as demo
    import cqg_ray.llm.rates as rates
    from cqg_ray.rundir import RunDir, run_stage

    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: (_ for _ in ()).throw(AssertionError("no measuring")))
    cfg = demo_config(tmp_path)
    run_stage(RunDir(cfg.run_dir), "questions", "h", lambda ctx: None, deps=[])
    assert demo.demo_sizing(cfg, [], 10) == {"overrides": {}, "reason": "not sized (its questions were written before): the config as it is"}
    # one written under the demo config's old cap of 16 clusters (its config.yaml) keeps them, unless --set says otherwise
    from cqg_ray.config import dump_config

    old = demo_config(tmp_path / "old", max_clusters=16)
    run = RunDir(old.run_dir)
    run_stage(run, "questions", "h", lambda ctx: None, deps=[])
    run.write_bytes("config.yaml", dump_config(old).encode())
    cfg = demo_config(tmp_path / "old")
    assert cfg.cqg.max_clusters is None
    assert demo.demo_sizing(cfg, [], 10)["overrides"] == {"cqg.max_clusters": 16}
    run.rm(demo.SIZED)
    assert demo.demo_sizing(cfg, ["cqg.max_clusters=20"], 10)["overrides"] == {}
    from cqg_ray.config import load_config

    fake = load_config("demo", [f"run_dir={tmp_path / 'f'}", "llm.backend=fake"])
    assert demo.demo_sizing(fake, [], 10)["reason"] == "not sized (the fake backend): the config as it is"
    assert demo.demo_sizing(demo_config(tmp_path / "z"), [], 0)["reason"] == "not sized (--minutes 0): the config as it is"


@pytest.mark.slow
def test_the_rates_measured_on_the_real_embedded_model(tmp_path):
    """time_engines on the bundled 0.5B as writer and answerer: exactly 8 tokens a sequence timed as written (the 8
    decoding steps of 9 tokens, the first coming with the reading) by 4 sequences decoded together, the load timed once for both,
    the long prompts' tokens read, the calls of 20 pairs (2 s at least), the read again after them, every time positive
    and finite, and rates_from turning them into Rates.
    Which rate is larger is a benchmark's question, not this test's: under a neighbour on the two cores (the other
    test worker) a timed comparison flips."""
    import math

    from cqg_ray.llm.rates import PAIRS_MIN_S, Rates, host_changed, rates_from, time_engines

    cfg = demo_config(tmp_path, writer_model="null")
    kept = []
    timed = time_engines(cfg.llm, cfg.llm, keep=kept.append)
    (model,) = kept  # one model for both, handed over with its engine loaded
    try:
        from cqg_ray.llm.answers import answer_requests
        from cqg_ray.llm.rates import RATE_QUESTIONS, RATE_TEXTS

        assert model._torch or model._model is not None
        scored = model.score(answer_requests(RATE_TEXTS[0], [0, 1], RATE_QUESTIONS[:2], "single", 20, 1))
        assert len(scored) == 2 and all(c.error is None for c in scored)
    finally:
        model.close()
    assert sorted(timed) == ["answer_read", "answerer_load", "pairs", "read", "read_again", "write", "write_batch", "writer_load"]
    assert cfg.llm.llamacpp.batch_generate >= 4 and timed["write_batch"] == (4, 4)
    assert timed["writer_load"][1] == 1 and timed["answerer_load"] == timed["writer_load"]  # one model: one load, counted for both
    assert timed["write"][1] == 4 * 8 and timed["read"][1] > 150 and timed["answer_read"][1] > 150
    assert timed["pairs"][1] % 20 == 0 and timed["pairs"][0] >= PAIRS_MIN_S  # calls of 20 pairs for at least 2 s
    assert timed["read_again"][1] == timed["read"][1]  # the same prompt read again after the answerer's work (one model)
    assert all(0 < s < math.inf for s, _ in timed.values())
    r = rates_from(timed)
    before, after = (timed[k][1] / timed[k][0] for k in ("read", "read_again"))
    # within HOST_CHANGE every rate is as timed but the read, the faster of the two; beyond it, each is taken to the
    # slower of the two reads (the other test worker can move the host's pace between them)
    changed = host_changed(after / before)
    w, a = (min(before, after) / before, min(before, after) / after) if changed else (1.0, 1.0)
    want = asdict(Rates(read=before * w if changed else max(before, after), write=32 / timed["write"][0] * w,
                        pairs=timed["pairs"][1] / timed["pairs"][0] * a, answer_read=timed["answer_read"][1] / timed["answer_read"][0] * a,
                        write_batch=4, writer_load=round(timed["writer_load"][0], 1), answerer_load=round(timed["writer_load"][0], 1),
                        host_speed=round(after / before, 3)))
    got = asdict(r)
    # the same ratios, worked out in another order here: equal to the last bits (1e-12), not bit for bit
    assert [k for k, v in got.items() if v is None] == [k for k, v in want.items() if v is None] == ["pace"]
    assert {k: v for k, v in got.items() if v is not None} == pytest.approx({k: v for k, v in want.items() if v is not None}, rel=1e-12)


def test_the_demo_refuses_a_missing_local_model_before_its_lease(tmp_path, capsys):
    from cqg_ray.cli import main

    run = tmp_path / "run"
    assert main(["demo", "--set", f"run_dir={run}", "--set", "llm.llamacpp.model=/nonexistent/model.gguf"]) == 2
    assert capsys.readouterr().err == ("error: no such file or folder: llm.llamacpp.model=/nonexistent/model.gguf (a local path; give "
                                       "one that exists, or a hub or bundled: name)\n")
    assert not run.exists()


def test_the_demo_refuses_a_file_or_a_model_folder_as_its_run_directory(tmp_path, capsys):
    """A run directory that is a file, or a model folder, is said (exit 2) before the lease and config.yaml go into it;
    before, a file was a FileExistsError traceback and a model folder became a run directory."""
    from cqg_ray.cli import main

    afile = tmp_path / "afile"
    afile.write_text("hi\n")
    assert main(["demo", "--set", f"run_dir={afile}"]) == 2
    assert capsys.readouterr().err == (f"error: {afile} is not a cqg-ray run directory (a file): give a run directory "
                                       "(--set run_dir=DIR), or a new folder to start one\n")
    model = tmp_path / "model"  # what not_a_run reads as a model folder: a config.json and no config.yaml
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["demo", "--set", f"run_dir={model}"]) == 2
    assert capsys.readouterr().err == (f"error: {model} is not a cqg-ray run directory (a model folder (config.json)): give a run "
                                       "directory (--set run_dir=DIR), or a new folder to start one\n")
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


@pytest.mark.parametrize("minutes", ["nan", "-1", "-inf"])
def test_the_demo_refuses_a_budget_that_is_nan_or_below_zero(minutes, tmp_path, capsys):
    """--minutes NaN sized the demo to its floor ('does not fit; this is the floor (nan min; ...)') and a negative
    budget ran it unsized, said as '--minutes 0': both are refused (exit 2) before anything runs."""
    from cqg_ray.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", f"--minutes={minutes}", "--set", f"run_dir={tmp_path / 'run'}"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(f"cqg-ray demo: error: argument --minutes: a time budget is 0 or more minutes (0: no "
                                            f"sizing), got {minutes}\n")
    assert not (tmp_path / "run").exists()


def test_the_demo_budget_takes_zero_a_fraction_and_inf():
    from cqg_ray.demo import budget_minutes

    assert [budget_minutes(s) for s in ("0", "0.5", "600", "inf")] == [0.0, 0.5, 600.0, float("inf")]


def test_the_reason_names_a_budget_under_a_minute_as_given():
    """--minutes 0.5 was said as '(0 min; ...)' beside 'does not fit; this is the floor'."""
    from cqg_ray.config import load_config
    from cqg_ray.demo import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    assert "does not fit; this is the floor (0.5 min; writer 5000 prompt tokens/s read" in size_demo(cfg, Rates(read=5000, write=500, pairs=500), 30)[1]
    assert "fits (12.5 min; writer" in size_demo(cfg, Rates(read=5000, write=500, pairs=500), 750)[1]


def test_a_resume_with_another_budget_says_it_keeps_its_sizing(tmp_path, monkeypatch, capsys):
    """A run directory sized at --minutes 10 and resumed with --minutes 3 keeps its sizing, and says so; before, the
    new budget was dropped without a word. Resumed with its own budget it says nothing more."""
    import cqg_ray.demo as demo
    import cqg_ray.llm.rates as rates

    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: rates.Rates(
        read=50, write=10, pairs=6, write_batch=4, writer_load=10, answerer_load=5, host_speed=1.0))

    def pipeline(cfg, until=None, **kwargs):  # the stages themselves are not run: the demo stops after the sizing
        if until == "cluster":
            return {}
        raise SystemExit(0)

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", pipeline)
    sets = [f"run_dir={tmp_path / 'run'}"]
    for minutes in (10, 3, 10):
        with pytest.raises(SystemExit):
            demo.run_demo("demo", sets, minutes=minutes)
    out = capsys.readouterr().out
    sizing = [line for line in out.splitlines() if " of 30 clusters, probes " in line]
    assert len(sizing) == 3 and len(set(sizing)) == 1  # the sizing line, each time the same
    assert out.count("demo sizing: kept from this run directory's first demo") == 1
    assert ("demo sizing: kept from this run directory's first demo (--minutes 10); --minutes 3 sizes a new run directory "
            "(--set run_dir=DIR)\n") in out


def test_a_damaged_sizing_is_said_with_what_to_do(tmp_path, capsys):
    """A demo_sizing.json that is not JSON, or JSON that is not a sizing (here a list), is an error (exit 2) that says
    to delete it; before, the second was a TypeError traceback (exit 1)."""
    from cqg_ray.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for text, what in (('{"overrides": {', "corrupt JSON artifact {path}: Expecting property name enclosed in double quotes: line 2 "
                                              "column 1 (char 16)"),
                       ("[1, 2]\n", "{path} is not a demo sizing (an object with its overrides, reason and minutes)"),
                       ('{"overrides": {}, "reason": "r", "minutes": "ten"}', "{path} is not a demo sizing (an object with its "
                                                                              "overrides, reason and minutes)")):
        (run / "demo_sizing.json").write_text(text + "\n" if text.startswith("{") else text)
        assert main(["demo", "--set", f"run_dir={run}"]) == 2
        err = capsys.readouterr().err
        assert err == "error: " + what.format(path=run / "demo_sizing.json") + ": delete it, and the same command sizes the run again\n"


def test_the_demo_stopped_by_sigterm_says_how_to_resume_and_gives_back_its_lease(tmp_path, monkeypatch, capsys):
    """`kill` (SIGTERM) stops the demo as it does `cqg-ray run`: exit 143, a line that says to run it again, the lease
    given back; before, the demo kept Ray's handler: a stack dump and an abort (exit 134), nothing said."""
    import signal

    from cqg_ray.cli import main
    from cqg_ray.lease import take_lease

    def stopped(cfg, until=None, **kwargs):
        # the handler in place when SIGTERM comes, called as the signal calls it: a real os.kill of this test process
        # took a CI worker down once (2026-12-07; not reproduced alone), so the real signal is left to test_cli's test
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        raise AssertionError("SIGTERM did not unwind the demo")

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", stopped)
    before = signal.getsignal(signal.SIGTERM)
    run = tmp_path / "run"
    assert main(["demo", "--set", f"run_dir={run}"]) == 143
    assert capsys.readouterr().err == "stopped: run the same command again to resume\n"
    assert signal.getsignal(signal.SIGTERM) is before
    with take_lease(str(run), "cqg-ray demo"):  # given back: a second writer takes it
        pass


def test_the_demo_help_says_where_it_writes_how_it_resumes_and_what_it_prints(capsys):
    """`cqg-ray demo --help` named none of the run directory, resuming, what the demo prints or its exit status."""
    from cqg_ray.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for said in ("The run directory is the config's run_dir: runs/demo under the current folder (--set run_dir=DIR for another).",
                 "Interrupted (Ctrl-C, or SIGTERM), the same command resumes: finished stages, finished LLM calls (RUN/llm/ledger/) "
                 "and the sizing (RUN/demo_sizing.json) are kept",
                 "two STS-B test pairs explained by their questions, and the model folder.",
                 "Exit status: 0 done, 1 a stage failed, 2 a bad config or input, 3 the run directory is in use by another run, "
                 "130/143 interrupted or stopped."):
        assert said in out, said
