"""The demo's sizing to the machine (`cqg_ray.sizing`, pure): the knobs that fit a budget at given rates, the floors,
the writer's time on its calls, and the top-up of a run short of its questions. No Ray, no LLM."""

import pytest

L40 = {"label.n_cluster": 20, "label.n_neighbor": 12, "label.n_random": 8}  # the demo's texts labelled a question (20 + 12 + 8), then the sizing's fewer
L30 = {"label.n_cluster": 15, "label.n_neighbor": 9, "label.n_random": 6}


def test_the_demo_keeps_its_floor_of_questions_through_the_reliability_drop():
    """The sizing's floor (MIN_QUESTIONS, at the measured yield a cluster) is also the model stage's min_kept: on a Zen 5
    the rule dropped 11 of 28 questions (select AUC on ~6 labels each), which would have left 17 in the model."""
    from cqg_ray.config import load_config
    from cqg_ray.sizing import MIN_QUESTIONS
    from cqg_ray.mbqa.stage import reliability_rules

    cfg = load_config("demo")
    assert cfg.train.min_kept == MIN_QUESTIONS == 20 and reliability_rules(cfg).min_kept == 20
    assert load_config("paper").train.min_kept == 0  # elsewhere the rule alone decides


def test_a_fast_machine_keeps_the_whole_demo():
    from cqg_ray.config import load_config
    from cqg_ray.sizing import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    assert cfg.cqg.max_clusters is None  # the sizing decides how many of the 30 clusters questions are written for
    sized, reason = size_demo(cfg, Rates(read=5000, write=500, pairs=500), 600)
    assert sized == {"cqg.max_clusters": 30, "cqg.p_p": 10, "cqg.p_h": 6, "cqg.p_e": 4, "cqg.n_h": 18, "cqg.n_e": 18, **L40}
    assert reason.startswith("30 of 30 clusters, probes 10/6/4 a question, 18 + 18 negatives a prompt, 40 texts labelled a question: "
                             "about ") and "fits (10 min;" in reason


def test_the_reason_says_where_the_host_changed_speed_under_the_measurement():
    from cqg_ray.config import load_config
    from cqg_ray.sizing import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    for steady in (1.05, 0.84, 1.29, None):  # within HOST_CHANGE (1.3x), or not timed
        assert size_demo(cfg, Rates(read=5000, write=500, pairs=500, host_speed=steady), 600)[1].endswith("answerer 500.0 pairs/s)")
    _, reason = size_demo(cfg, Rates(read=5000, write=500, pairs=500, host_speed=2.35), 600)
    assert reason.endswith("answerer 500.0 pairs/s; the host ran 2.35x as fast after the writer's timings as during them: "
                           "all rates at the slower)")


def test_generation_is_sized_as_the_writer_works_through_its_calls():
    """generation_s: every prompt's own tokens read, the common prefix once a wave, and LONGEST_REPLY_TOKENS decoding
    steps a wave, a step of b sequences taking the timed step (write_batch / write) and DECODE_TOKEN_COST tokens'
    reading for each sequence beyond the timed batch; calls of GENERATE_ROWS prompts."""
    from cqg_ray.cqg.stage import GENERATE_ROWS
    from cqg_ray.sizing import DECODE_TOKEN_COST, LONG_PROMPT_READ, LONGEST_REPLY_TOKENS, SHARED_PROMPT_TOKENS, generation_s
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
    from cqg_ray.sizing import long_prompt_read

    assert long_prompt_read("torch-bfloat16", {"avx512_bf16", "amx_bf16", "amx_tile"}) == 1.0  # Intel AMX: as timed
    assert long_prompt_read("torch-bfloat16", {"avx512_bf16", "avx512f"}) == 0.75  # AMD Zen 4 / Zen 5
    assert long_prompt_read("llamacpp", {"avx2"}) == 0.77
    assert long_prompt_read("torch-float32", {"avx2"}) == 1.0


def test_a_slow_machine_drops_clusters_then_probes_then_negatives_and_keeps_the_floor():
    from cqg_ray.config import load_config
    from cqg_ray.sizing import (DECODE_TOKEN_COST, LABEL_PAIRS_SPEED, PROBE_PAIRS_SPEED, PROMPT_TOKENS, REST_S, SHARED_PROMPT_TOKENS,
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


def test_top_up_writes_for_the_clusters_that_give_the_floor_at_the_runs_own_yield():
    from cqg_ray.sizing import MIN_QUESTIONS, top_up

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
    from cqg_ray.sizing import short_note

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


def test_the_reason_names_a_budget_under_a_minute_as_given():
    """--minutes 0.5 was said as '(0 min; ...)' beside 'does not fit; this is the floor'."""
    from cqg_ray.config import load_config
    from cqg_ray.sizing import size_demo
    from cqg_ray.llm.rates import Rates

    cfg = load_config("demo")
    assert "does not fit; this is the floor (0.5 min; writer 5000 prompt tokens/s read" in size_demo(cfg, Rates(read=5000, write=500, pairs=500), 30)[1]
    assert "fits (12.5 min; writer" in size_demo(cfg, Rates(read=5000, write=500, pairs=500), 750)[1]
