"""Capacity planner: hand-computed small cases, the packing estimate against the real make_label_plan, the paper's setting."""

import json
import math

import pytest

from cqg_ray.cli import main
from cqg_ray.config import LabelConfig, config_from_dict, load_config
from cqg_ray.llm.prompts import answer_prompt, cqg_prompt
from cqg_ray.plan import THROUGHPUTS, Workload, capacity_plan, format_plan, label_packing_estimate, parse_count, simulate_label_packing


def small_cfg(answer_mode="packed", **label):
    return config_from_dict({
        "llm": {"answer_mode": answer_mode},
        "cluster": {"k": 10},
        "cqg": {"n_p": 2, "n_h": 3, "n_e": 3, "questions_per_prompt": 10, "p_p": 2, "p_h": 1, "p_e": 1, "t": 2},
        "label": {"n_cluster": 6, "n_neighbor": 4, "n_random": 2, "questions_per_prompt": 20, **label},
    })


def stage(p, name):
    return next(r for r in p["stages"] if r["stage"] == name)


@pytest.mark.parametrize("text,value", [("6.8M", 6_800_000), ("10k", 10_000), ("5,000", 5_000), ("5000", 5_000), ("1e6", 1_000_000),
                                        ("2.5B", 2_500_000_000), ("9_614", 9_614), ("0.5k", 500), (" 7m ", 7_000_000), (42, 42)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["6.8", "abc", "-5", "1.2345k", "10x", ""])
def test_parse_count_rejects(text):
    with pytest.raises(ValueError):
        parse_count(text)


def test_small_plan_by_hand():
    # k=10 clusters, 10 questions per generation prompt, probes 2+1+1, t=2, survival 0.5; labels 6+4+2 per question
    p = capacity_plan(small_cfg(), docs=1000, dedup_survival=0.5)
    c = p["counts"]
    assert stage(p, "cqg-generate")["llm_requests"] == 10
    assert c["candidates"] == 100
    assert stage(p, "cqg-probe")["llm_requests"] == 10 * 4  # one prompt per probe text: 10 questions fit one prompt of 20
    assert c["probe_pairs"] == 400 and stage(p, "cqg-probe")["completion_tokens"] == 400 * 4
    assert c["selected_top_t"] == 20 and c["questions"] == 10
    assert c["label_pairs"] == 10 * 12 and c["label_prompts_full_packing"] == 6  # ceil(120 / 20)
    assert c["holdout_pairs"] == 12
    # each question's 12 labels: 90% trained on, the 10% held out split half to select, half to report (too few)
    assert (c["train_labels_per_question"], c["heldout_select_per_question"], c["heldout_report_per_question"]) == (10.8, 0.6, 0.6)
    assert "per question: ~10.8 to train on, ~0.6 held out to calibrate and select, ~0.6 for its shown figures (needs 5, 2 of them yes; " \
           "too few: raise label.n_* or train.holdout)" in format_plan(p)
    assert stage(p, "label")["completion_tokens"] == 120 * 4
    assert stage(p, "encode")["texts_encoded"] == 1000 and stage(p, "embed")["texts_encoded"] == 1000
    assert stage(p, "cqg-dedup")["texts_encoded"] == 100
    assert c["train_pairs_total"] == round(120 * 0.9 * 100)  # 100 epochs, the default
    t = p["totals"]
    assert t["llm_requests"] == 10 + 40 + stage(p, "label")["llm_requests"]
    assert t["texts_encoded"] == 1000 + 100 + 1000


def test_single_pass_plan_by_hand():
    # the same run answered single-pass: one request per pair, each text once, each pair's question line once
    w = Workload()
    p = capacity_plan(small_cfg("single"), docs=1000, dedup_survival=0.5, workload=w)
    c = p["counts"]
    probe, lab = stage(p, "cqg-probe"), stage(p, "label")
    assert probe["llm_requests"] == 400 and probe["completion_tokens"] == 400
    assert lab["llm_requests"] == 120 and lab["completion_tokens"] == 120
    head = 20 + len('Evaluate the following text chunk based on the yes/no questions provided. Answer each question with either "yes" or "no".\n\n') / 4
    per_text = 128 + len("Text Chunk:\n\n\nQuestions:\n") / 4
    assert probe["prompt_tokens"] == round(10 * 4 * per_text + 400 * (15 + 9) + math.ceil(400 / 64) * head)
    assert lab["prompt_tokens"] == round(c["label_texts"] * per_text + 120 * (15 + 9) + math.ceil(120 / 64) * head)


def test_probe_prompts_split_at_20_questions():
    # 30 questions per cluster are asked in chunks of 20: 2 prompts per probe text
    p = capacity_plan(small_cfg(), docs=1000, questions_per_cluster=30, dedup_survival=0.5)
    assert stage(p, "cqg-probe")["llm_requests"] == 10 * 4 * 2
    assert p["counts"]["probe_pairs"] == 10 * 4 * 30


def test_token_model_by_hand():
    w = Workload()
    p = capacity_plan(small_cfg(), docs=1000, dedup_survival=0.5, workload=w)
    # generation: 20 chat tokens + template chars / 4 + 8 texts x 128 tokens (128 < 1000 chars / 4)
    template = len(cqg_prompt([""] * 2, [""] * 6, 10))
    assert stage(p, "cqg-generate")["prompt_tokens"] == round(10 * (20 + template / 4 + 8 * 128))
    assert stage(p, "cqg-generate")["completion_tokens"] == 100 * (15 + 3)
    # every extra question in an A.3 prompt costs "\n2. " (4 chars = 1 token) + 15 question tokens
    assert len(answer_prompt("", ["", ""])) - len(answer_prompt("", [""])) == 4
    base = 20 + (len(answer_prompt("", [""])) - 4) / 4 + 128  # a prompt without its questions
    probe = stage(p, "cqg-probe")
    assert probe["prompt_tokens"] == round(40 * (base + 10 * 16))
    lab = stage(p, "label")
    assert lab["prompt_tokens"] == round(lab["llm_requests"] * base + 120 * 16)
    # texts are clipped at max_text_chars: 1000 chars / 4 = 250 tokens at most
    long = capacity_plan(small_cfg(), docs=1000, dedup_survival=0.5, workload=Workload(prompt_tokens_per_text=10_000))
    assert stage(long, "cqg-generate")["prompt_tokens"] == round(10 * (20 + template / 4 + 8 * 250))


def test_hours_by_hand():
    tp = THROUGHPUTS["gpu"]
    p = capacity_plan(small_cfg(), docs=1000, dedup_survival=0.5, gpus=4)
    gen = stage(p, "cqg-generate")
    want = (gen["prompt_tokens"] / tp.llm_prompt_tokens_per_s + gen["completion_tokens"] / tp.llm_completion_tokens_per_s) / 3600
    assert gen["device_hours"] == pytest.approx(want, rel=1e-9)
    assert gen["wall_hours"] == pytest.approx(want / 4)
    assert stage(p, "encode")["device_hours"] == pytest.approx(1000 / 1500 / 3600)
    train = stage(p, "train")  # one train worker in the config: no speed-up from 4 GPUs
    assert train["wall_hours"] == train["device_hours"] == pytest.approx(120 * 0.9 * 100 / 1e6 / 3600)  # 100 epochs


def test_the_writer_has_its_own_rates_and_single_pass_answers_are_read_not_decoded():
    from dataclasses import replace

    tp = replace(THROUGHPUTS["cpu"], writer_prompt_tokens_per_s=30.0, writer_completion_tokens_per_s=3.0)
    single = capacity_plan(small_cfg("single"), docs=1000, dedup_survival=0.5, throughput=tp)
    gen = stage(single, "cqg-generate")  # the rows print tokens rounded to whole ones: hours agree to their rounding
    assert gen["device_hours"] == pytest.approx((gen["prompt_tokens"] / 30 + gen["completion_tokens"] / 3) / 3600, rel=1e-4)
    for name in ("cqg-probe", "label"):  # one position's logits read a pair: its prompt tokens are the work
        row = stage(single, name)
        assert row["completion_tokens"] > 0
        assert row["device_hours"] == pytest.approx(row["prompt_tokens"] / tp.llm_prompt_tokens_per_s / 3600, rel=1e-4)
    packed = stage(capacity_plan(small_cfg(), docs=1000, dedup_survival=0.5, throughput=tp), "label")  # answers decoded
    want = (packed["prompt_tokens"] / tp.llm_prompt_tokens_per_s + packed["completion_tokens"] / tp.llm_completion_tokens_per_s) / 3600
    assert packed["device_hours"] == pytest.approx(want, rel=1e-4)


def test_measure_takes_the_rates_of_this_machines_engines(monkeypatch, capsys):
    """`--measure`: the writer's rates for generation, the answerer's reading for probes and labels, from
    `cqg_ray.llm.rates.machine_rates` on the config's writer and answerer (a stand-in here)."""
    import cqg_ray.llm.rates as rates

    asked = []
    measured = rates.Rates(read=40.0, write=4.0, pairs=2.0, answer_read=30.0)

    def machine_rates(w, a, say):
        say("measuring, here a stand-in")  # what it says goes to stderr: stdout stays the JSON
        asked.append((w.llamacpp.model, a.llamacpp.model))
        return measured, "measured now"

    monkeypatch.setattr(rates, "machine_rates", machine_rates)
    assert main(["plan", "--config", "reference", "--preset", "cpu", "--measure", "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines().count("plan: measuring, here a stand-in") == 1
    p = json.loads(out.out)
    assert asked == [("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-1.5b")]
    tp = p["throughput"]
    assert (tp["writer_prompt_tokens_per_s"], tp["writer_completion_tokens_per_s"], tp["llm_prompt_tokens_per_s"]) == (40.0, 4.0, 30.0)
    assert "MEASURED on this machine" in tp["source"] and tp["encoder_texts_per_s"] == THROUGHPUTS["cpu"].encoder_texts_per_s
    gen, label = stage(p, "cqg-generate"), stage(p, "label")
    assert gen["device_hours"] == pytest.approx((gen["prompt_tokens"] / 40 + gen["completion_tokens"] / 4) / 3600, rel=1e-6)
    assert label["device_hours"] == pytest.approx(label["prompt_tokens"] / 30 / 3600, rel=1e-6)
    assert main(["plan", "--config", "reference", "--preset", "cpu", "--measure"]) == 0
    assert "the writer 40 prompt tok/s + 4.0 output tok/s" in capsys.readouterr().out
    assert main(["plan", "--set", "llm.backend=openai", "--measure"]) == 2
    assert "--measure measures the embedded engines" in capsys.readouterr().err and len(asked) == 2
    assert main(["plan", "--set", "cqg.writer_model=bundled:nosuch", "--measure"]) == 2  # said before the engines load
    assert capsys.readouterr().err.startswith("error: cqg.writer_model: unknown bundled model 'nosuch'") and len(asked) == 2


def test_packing_own_cluster_only_matches_make_plan():
    # no neighbour or random texts, every selected question survives: each of a cluster's 6 front texts is asked
    # by all 25 questions of its cluster -> ceil(25 / 20) = 2 prompts per text, 10 clusters x 6 texts
    lab = LabelConfig(n_cluster=6, n_neighbor=0, n_random=0)
    est = label_packing_estimate(1000, 10, 250, 25, lab)
    assert est["prompts"] == 10 * 6 * 2 and est["texts"] == 60
    sim = simulate_label_packing(1000, 10, 250, 25, lab)
    assert sim == {"texts": 60, "prompts": 120, "pairs": 250 * 6}


def test_packing_random_only_matches_make_plan():
    # 40 questions x 10 random texts = 400 pairs walk a pool of 400 / 20 = 20 texts: 20 prompts of 20 questions
    lab = LabelConfig(n_cluster=0, n_neighbor=0, n_random=10)
    est = label_packing_estimate(1000, 10, 40, 4, lab)
    assert est["prompts"] == 20 and est["texts"] == 20 and est["random_pool"] == 20
    sim = simulate_label_packing(1000, 10, 40, 4, lab)
    assert sim == {"texts": 20, "prompts": 20, "pairs": 400}


def test_packing_estimate_close_to_make_plan():
    # the paper's 500/300/200 with 20 questions per prompt, survival 0.48, on a balanced synthetic clustering
    lab = LabelConfig()
    n, k, per_cluster = 150_000, 150, 4
    m = round(k * per_cluster * 0.4807)
    est = label_packing_estimate(n, k, m, per_cluster, lab)
    sim = simulate_label_packing(n, k, m, per_cluster, lab)
    assert sim["pairs"] == m * 1000
    assert est["prompts"] == pytest.approx(sim["prompts"], rel=0.03)
    assert est["texts"] == pytest.approx(sim["texts"], rel=0.03)


def test_paper_setting_matches_appendix_c_d():
    cfg = load_config("paper")
    p = capacity_plan(cfg, docs=parse_count("6.8M"), prices=(0.075, 0.3))  # GPT-4o-mini batch prices (Appendix C)
    c = p["counts"]
    assert c["clusters"] == 5000 and c["candidates"] == 50_000
    assert stage(p, "cqg-generate")["llm_requests"] == 5000  # one A.1 prompt per cluster, 6 + 18 + 18 texts
    assert stage(p, "cqg-probe")["llm_requests"] == 5000 * 10  # 5 + 3 + 2 probe texts per cluster
    assert c["selected_top_t"] == 20_000 and c["questions"] == 9_614  # Appendix D: 9,614 after dedup
    assert c["label_pairs"] == 9_614_000  # ~10M pairs (Appendix B/C)
    assert c["label_prompts_full_packing"] == 480_700  # 20 questions per prompt -> ~500k prompts
    assert c["holdout_pairs"] == 961_400  # the paper's held-out support: 958,734 pairs (Table 9)
    assert abs(c["holdout_pairs"] - 958_734) / 958_734 < 0.01
    # the paper's $31 for the labelling with GPT-4o-mini: our token model (assumptions) lands close to it
    assert 25 <= c["label_usd_full_packing"] <= 37
    # our packing asks ~4 questions per prompt (a text is shared by the questions of one cluster and its neighbours)
    assert 2.0e6 < c["label_prompts"] < 3.0e6
    assert stage(p, "encode")["texts_encoded"] == 6_800_000 and stage(p, "embed")["texts_encoded"] == 6_800_000
    assert p["inputs"]["dim"] == 1024
    # 10,000 questions exactly (survival 0.5): 10M pairs and 500k prompts at full packing
    p10 = capacity_plan(cfg, docs=6_800_000, dedup_survival=0.5)
    assert p10["counts"]["questions"] == 10_000
    assert p10["counts"]["label_pairs"] == 10_000_000 and p10["counts"]["label_prompts_full_packing"] == 500_000


def test_qaemb_uses_its_own_prompt_and_survival():
    cfg = config_from_dict({"cqg": {"method": "qaemb"}})
    p = capacity_plan(cfg, docs=6_800_000)
    assert p["counts"]["questions"] == 10_654  # Appendix D: QAEmb-MBQA has 10,654 questions


def test_limits_and_errors():
    cfg = config_from_dict({"corpus": {"limit": 3000}, "cluster": {"k": 30}, "cqg": {"max_clusters": 12}})
    p = capacity_plan(cfg)  # docs from corpus.limit
    assert p["counts"]["docs"] == 3000 and stage(p, "cqg-generate")["llm_requests"] == 12
    with pytest.raises(ValueError, match="corpus size"):
        capacity_plan(config_from_dict({}))
    with pytest.raises(ValueError, match="clusters"):
        capacity_plan(config_from_dict({}), docs=100)
    with pytest.raises(ValueError, match="dedup_survival"):
        capacity_plan(config_from_dict({}), docs=10_000, dedup_survival=0)


def test_cli_json_and_table(capsys):
    assert main(["plan", "--docs", "6.8M", "--clusters", "5000", "--json", "--gpus", "8"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["counts"]["docs"] == 6_800_000 and p["counts"]["questions"] == 9_614 and p["inputs"]["gpus"] == 8
    assert main(["plan", "--docs", "6.8M", "-k", "5k", "--preset", "cpu", "--llm-tokens-per-s", "1000"]) == 0
    out = capsys.readouterr().out
    for word in ("cqg-generate", "cqg-probe", "label", "encode", "embed", "total", "m = 9,614", "9,614,000", "480,700"):
        assert word in out
    assert "1,000 prompt tok/s + 1,000 output tok/s" in out


def test_cli_bad_count_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--docs", "lots"])
    assert e.value.code == 2
    assert "cannot read 'lots' as a count" in capsys.readouterr().err


def test_counts_past_a_trillion_are_refused_and_huge_hours_stay_in_their_column(capsys):
    from cqg_ray.plan.format import hours

    for flag, named in (("--docs", "--docs"), ("--clusters", "--clusters/-k"), ("--embed-docs", "--embed-docs")):
        with pytest.raises(SystemExit) as e:
            main(["plan", flag, "1e30"])  # it printed 24-digit hours
        assert e.value.code == 2 and capsys.readouterr().err.strip().endswith(f"argument {named}: at most 1T (10^12), got 1e30")
    assert (hours(0.904), hours(99999.994), hours(185185.19), hours(1.39e10), hours(2.8e17)) == (
        "0.90", "99999.99", "185k", "13.9B", "2.8e+17")
    assert main(["plan", "--docs", "1T", "--encoder-texts-per-s", "1e-9"]) == 0  # a tiny rate: 2.8e+17 encoder hours
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()
    assert table[1].split()[-2:] == ["2.8e+17", "2.8e+17"] and len({len(row) for row in table}) == 1, table


def test_cli_impossible_figures_are_refused(capsys):
    for flag, value, says in (("--encoder-texts-per-s", "-1", "argument --encoder-texts-per-s: must be above 0, got -1"),
                              ("--llm-tokens-per-s", "0", "argument --llm-tokens-per-s: must be above 0, got 0"),
                              ("--cpus", "0", "argument --cpus: must be above 0, got 0"),
                              ("--dim", "1.5", "argument --dim: '1.5' is not a whole number"),
                              ("--questions-per-cluster", "0", "argument --questions-per-cluster: must be above 0, got 0"),
                              ("--parse-rate", "0", "argument --parse-rate: must be above 0, got 0"),
                              ("--filter-survival", "1.5", "argument --filter-survival: a share lies in (0, 1], got 1.5"),
                              ("--usd-per-m-tokens", "-1 0.3", "argument --usd-per-m-tokens: a price is 0 or more, got -1"),  # was -412 USD
                              ("--usd-per-m-tokens", "0.1 nan", "argument --usd-per-m-tokens: a price is 0 or more, got nan"),
                              ("--usd-per-m-tokens", "0.1 x", "argument --usd-per-m-tokens: 'x' is not a number")):
        with pytest.raises(SystemExit) as e:
            main(["plan", flag, *value.split()])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(says), (flag, value)
    assert main(["plan", "--docs", "1M", "--parse-rate", "1", "--encoder-texts-per-s", "2500", "--json"]) == 0
    assert main(["plan", "--docs", "1M", "--usd-per-m-tokens", "0", "0.3"]) == 0  # a free prompt side is a price


def test_simulate_refuses_a_k_or_a_corpus_whose_draw_does_not_fit(capsys):
    """--simulate at k = 1M asked numpy for a 1M x 1M float64 matrix, at 1e12 texts for 1e12 int64s: MemoryError tracebacks."""
    assert main(["plan", "--docs", "2M", "--clusters", "1M", "--simulate"]) == 2
    assert capsys.readouterr().err == ("error: --simulate draws a k x (k - 1) matrix for the neighbour lists, 7,451 GiB at k = "
                                       "1,000,000: simulate at k <= 16,384, or leave --simulate out (the estimate needs no draw)\n")
    assert main(["plan", "--docs", "2M", "--clusters", "1M", "--json"]) == 0  # the estimate alone
    assert main(["plan", "--docs", "1e12", "--simulate"]) == 2
    assert capsys.readouterr().err == ("error: --simulate draws every text's cluster, 14,901 GiB at 1,000,000,000,000 texts: simulate "
                                       "at --docs <= 100,000,000, or leave --simulate out (the estimate needs no draw)\n")


def test_demo_config_plan():
    # the embedded demo's scale knobs are honoured: its corpus sample, questions for only cqg.max_clusters clusters,
    # n_cluster + n_neighbor + n_random texts per question; and the plan uses the throughput it was given
    cfg = load_config("demo", ["cqg.max_clusters=16"])  # as the demo's sizing sets it
    p = capacity_plan(cfg, throughput=THROUGHPUTS["cpu"])
    c = p["counts"]
    assert cfg.corpus.limit < 6_800_000 and cfg.cqg.max_clusters < cfg.cluster.k  # else this test checks nothing of the demo
    assert c["docs"] == cfg.corpus.limit and c["clusters_generated"] == cfg.cqg.max_clusters
    assert c["selected_top_t"] == cfg.cqg.max_clusters * cfg.cqg.t
    assert c["questions"] == round(c["selected_top_t"] * 9_614 / 20_000)  # the paper's 9,614 of 20,000 survive dedup (Appendix 'Our CQG-MBQA Model')
    assert c["label_pairs"] == c["questions"] * (cfg.label.n_cluster + cfg.label.n_neighbor + cfg.label.n_random)
    assert math.isclose(p["throughput"]["llm_completion_tokens_per_s"], THROUGHPUTS["cpu"].llm_completion_tokens_per_s)


def fake_run(tmp_path, ledgers: dict, encode_tps=None, train_pps=None, cached: dict | None = None):
    """A run directory with the given ledger totals {stage: (prompt, completion, wall_s)}; ``cached``: {stage: [the prompt
    tokens a prefix cache served in each run]}."""
    from cqg_ray.rundir import RunDir

    run = RunDir(str(tmp_path / "run"))
    if encode_tps is not None:
        run.write_manifest("encode", "h", [], {"documents": 10, "texts_per_s": encode_tps}, 1.0)
    for stage, (p, c, wall) in ledgers.items():
        runs = [{"cached_prompt_tokens": n} for n in (cached or {}).get(stage, [])]
        run.write_json(f"llm/ledger/{stage}/_stats.json", {"totals": {"prompt_tokens": p, "completion_tokens": c, "wall_s": wall}, "runs": runs})
    if train_pps is not None:
        run.write_manifest("model", "h", [], {"pairs": 10}, 1.0, {"final_metrics": {"pairs_per_s": train_pps}})
    return run.root_uri


def test_calibrate_solves_prompt_and_output_rates(tmp_path):
    from cqg_ray.plan import calibrate

    # prompt 100 tok/s, output 10 tok/s: generation 1000/100 + 500/10 = 60 s, labels 2000/100 + 100/10 = 30 s
    root = fake_run(tmp_path, {"cqg-generate": (1000, 500, 60.0), "labels": (2000, 100, 30.0)}, encode_tps=500.0, train_pps=1234.0)
    tp = calibrate(root, THROUGHPUTS["gpu"])
    assert tp.llm_prompt_tokens_per_s == pytest.approx(100) and tp.llm_completion_tokens_per_s == pytest.approx(10)
    assert tp.encoder_texts_per_s == 500 and tp.train_pairs_per_s == 1234
    assert "MEASURED" in tp.source


def test_calibrate_counts_the_prompt_tokens_read_not_those_a_prefix_cache_served(tmp_path):
    # single-pass labels: 10,000 prompt tokens in the ledger, 8,000 of them served by the prefix tree (read once for
    # many prompts), so 2,000 read at 100 tok/s + 100 output at 10 tok/s = 30 s. Counting all 10,000 made the rate 5x
    # what the engine reads, and the plan (which counts tokens read once) 5x too short
    from cqg_ray.plan import calibrate

    root = fake_run(tmp_path, {"cqg-generate": (1000, 500, 60.0), "labels": (10_000, 100, 30.0)}, cached={"labels": [5_000, 3_000]})
    tp = calibrate(root, THROUGHPUTS["cpu"])
    assert tp.llm_prompt_tokens_per_s == pytest.approx(100) and tp.llm_completion_tokens_per_s == pytest.approx(10)


def test_calibrate_with_one_llm_stage_uses_one_rate(tmp_path, capsys):
    from cqg_ray.plan import calibrate

    root = fake_run(tmp_path, {"labels": (2000, 100, 30.0)})
    tp = calibrate(root, THROUGHPUTS["cpu"])
    assert tp.llm_prompt_tokens_per_s == tp.llm_completion_tokens_per_s == pytest.approx(2100 / 30)
    assert tp.encoder_texts_per_s == THROUGHPUTS["cpu"].encoder_texts_per_s  # not measured: the preset's
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["throughput"]["llm_prompt_tokens_per_s"] == pytest.approx(70)
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", str(tmp_path / "nothing")]) == 2
    assert "no run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_paper_packing_estimate_matches_make_plan_at_full_scale():
    # 6.8M texts, 5,000 clusters, 9,614 questions: the real planner on a balanced synthetic clustering (~1 minute)
    lab = LabelConfig()
    est = label_packing_estimate(6_800_000, 5000, 9_614, 4, lab)
    sim = simulate_label_packing(6_800_000, 5000, 9_614, 4, lab)
    assert sim["pairs"] == 9_614_000
    assert est["prompts"] == pytest.approx(sim["prompts"], rel=0.01)
    assert est["texts"] == pytest.approx(sim["texts"], rel=0.01)


def test_prompt_tokens_per_labelled_pair_for_both_plans_and_answer_modes():
    # the paper's run: 6.8M texts, 5,000 clusters; the labelled random pool and single-pass answering both cut tokens per pair
    p = capacity_plan(config_from_dict({}), docs=6_800_000, clusters=5000)
    t = p["counts"]["label_prompt_tokens_per_pair"]
    assert t == {
        "labelled": {"packed": 69.2, "single": 57.5, "texts": 2_339_797, "prompts_packed": 2_359_182},
        "corpus": {"packed": 71.3, "single": 58.3, "texts": 2_402_857, "prompts_packed": 2_450_275},
        "floor": {"texts": 2_318_192, "single": 57.2, "single_without_texts": 24.0},
    }
    label = stage(p, "label")
    assert label["llm_requests"] == 9_614_000 and label["completion_tokens"] == 9_614_000  # single-pass: one request per pair
    packed = capacity_plan(config_from_dict({"llm": {"answer_mode": "packed"}}), docs=6_800_000, clusters=5000)
    assert stage(packed, "label")["llm_requests"] == 2_359_182
    assert "single-pass   57.5*" in format_plan(p)


def test_prompt_length_against_the_context_by_hand():
    """The default config's A.1 prompt (42 texts of up to 1,000 characters) against the embedded engine's n_ctx."""
    from cqg_ray.plan.tokens import context_check

    cfg = config_from_dict({})
    w = Workload()
    rows = {r["stage"]: r for r in context_check(cfg, w)}
    gen = rows["cqg-generate"]
    template = len(cqg_prompt([""] * 6, [""] * 36, 10))
    base = w.chat_overhead_tokens + template / 4
    assert gen["context"] == 4096 and gen["reply_tokens"] == 400 and gen["source"] == "llm.llamacpp.n_ctx"
    assert gen["prompt_tokens_mean"] == round(base + 42 * 128) and gen["prompt_tokens_longest"] == round(base + 42 * 250)
    assert gen["text_chars_that_fit"] == int((4096 - 400 - base) / 42 * 4)
    assert gen["verdict"] == f"every prompt clipped: texts cut to ~{gen['text_chars_that_fit']:,} characters"
    assert rows["labels"]["verdict"] == "fits" and rows["labels"]["reply_tokens"] == 1
    small = {r["stage"]: r for r in context_check(config_from_dict({"llm": {"llamacpp": {"n_ctx": 400}}}), w)}
    assert small["cqg-generate"]["verdict"] == "does not fit even without texts: the stage stops with an error"
    assert small["labels"]["verdict"].startswith("prompts with long texts clipped: texts cut to ~")
    server = {r["stage"]: r for r in context_check(config_from_dict({"llm": {"backend": "openai"}}), w)}
    assert server["labels"]["context"] is None and server["labels"]["verdict"] == "checked at run time against the server's context"
    text = format_plan(capacity_plan(cfg, docs=100_000))
    assert "prompt length against the engine's context (llm.llamacpp.n_ctx: 4,096 tokens, minus the reply):" in text
    assert f"cqg-generate  mean ~{gen['prompt_tokens_mean']:,} tokens, longest ~{gen['prompt_tokens_longest']:,} (+400 reply): every prompt clipped" in text


def test_calibrate_shows_what_the_guard_clipped(tmp_path, capsys):
    from cqg_ray.rundir import RunDir

    root = fake_run(tmp_path, {"labels": (2000, 100, 30.0)})
    run = RunDir(root)
    run.write_manifest("questions", "h", [], {"generation_prompts_checked": 8, "generation_prompts_clipped": 8, "generation_texts_dropped": 3,
                                             "generation_chars_cut": 9000, "probe_prompts_checked": 40, "probe_prompts_clipped": 0,
                                             "probe_texts_dropped": 0, "probe_chars_cut": 0}, 1.0)
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root]) == 0
    out = capsys.readouterr().out
    assert "cqg-generate 8 of 8 prompts clipped, 3 texts dropped, 9,000 characters cut; cqg-probe 0 of 40 prompts clipped" in out


def test_calibrate_measures_the_tokens_of_a_text(tmp_path, capsys):
    """The prepared texts' mean length over 4 characters a token, in place of the assumed 128 (the demo's sentences are
    ~24); only the first MEASURED_TEXTS are read; a figure given on the command line wins."""
    import pyarrow as pa

    import cqg_ray.plan.cli as plan_cli
    from cqg_ray.rundir import RunDir

    root = fake_run(tmp_path, {"labels": (2000, 100, 30.0)})
    run = RunDir(root)
    run.write_table("prepare/part-0.parquet", pa.table({"doc_id": ["a", "b"], "text": ["x" * 40, "é" * 80]}))  # characters, not bytes
    run.write_table("prepare/part-1.parquet", pa.table({"doc_id": ["c"], "text": ["y" * 400]}))
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["prompt_tokens_per_text"] == 128  # no finished prepare stage: assumed
    run.write_manifest("prepare", "h", [], {"documents": 3}, 1.0)
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["workload"]["prompt_tokens_per_text"] == 520 / 3 / 4 and p["measured"]["texts"] == {"read": 3, "chars": 520, "mean_chars": 173.3}
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root]) == 0
    assert (f"(per text: measured in {root}, 173.3 characters a text on average over 3 prepared texts, at 4 a token, unless "
            "--prompt-tokens-per-text gave it)") in capsys.readouterr().out
    assert plan_cli.measured_texts(root, limit=2) == {"read": 2, "chars": 120, "mean_chars": 60.0}
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--prompt-tokens-per-text", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["prompt_tokens_per_text"] == 50


def memory_row(p, stage, process):
    return next(r for r in p["memory"] if r["stage"] == stage and r["process"] == process)


def test_memory_table_small(capsys):
    assert main(["plan", "--docs", "1000", "--clusters", "10", "--set", "encode.unit_rows=100", "--set", "corpus.rows_per_shard=1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("stage    process           peak GB  holds")
    assert lines[at - 1].startswith("predicted peak memory per process (estimates")
    assert lines[at + 1] == "prepare  driver               0.30  base"
    assert lines[at + 4] == "encode   encoder actor        0.89  encoder weights, a unit of 100 texts and embeddings"
    assert lines[at + 8] == "cqg      keywords task        0.30  1,000 keyword texts (100 a cluster) and their sparse word counts"
    assert lines[at + 9].startswith("cqg      writer engine") and lines[at + 10].startswith("cqg      probe engine")
    assert lines[at + 11] == ("label    driver               0.30  clusters, places, plan arrays (19,000 pairs, 1,372 prompts), plan table "
                             "and Parquet bytes")
    assert lines[at + 12] == "label    ledger index         0.31  every ledger key of 19,000 requests, sorted"
    assert lines[at + 16] == "train    train worker x1      0.80  its shard (999 embeddings, 19,000 labels), heads + grads + Adam"
    assert main(["plan", "--docs", "1000", "--clusters", "10", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    # 300 MB base + 1,000 texts x 44 (ids, labels, places) + 19,000 pairs x 17 + 1,372 prompts x 16 + 2 x (19,000 x 4 + 1,372 x 16)
    assert memory_row(p, "label", "driver")["bytes"] == 300_000_000 + 44_000 + 323_000 + 21_952 + 195_904
    # base + torch + MiniLM fp32 (22.7M x 4) + 10,000 texts x (2 x 512 characters + 384 x 4)
    assert memory_row(p, "encode", "encoder actor")["bytes"] == 300_000_000 + 500_000_000 + 90_800_000 + 10_000 * (1024 + 1536)


def test_the_llm_engines_weights_follow_the_engine_that_does_the_work():
    """The GGUF for llama.cpp; the GGUF plus its parameters at 4 (float32) or 2 (bfloat16) bytes where a torch engine does
    the work: the 1.5B in torch-float32 is ~6.2 GB more, what a 2-core machine has to hold beside the rest; the
    parameters alone where torch does both kinds of work."""
    from cqg_ray.config import load_config
    from cqg_ray.plan.memory import PARAMS, WEIGHTS, llm_weights

    cfg = load_config(None, ["llm.llamacpp.score_engine=torch-float32", "llm.llamacpp.generate_engine=llamacpp"])
    small, big = "bundled:qwen2.5-coder-0.5b", "bundled:qwen2.5-coder-1.5b"
    assert llm_weights(cfg, small, "score") == (WEIGHTS[small] + 4 * PARAMS[small],
                                                f"{small} GGUF and its weights in float32 (torch-float32 scores)")
    assert llm_weights(cfg, big, "generate") == (WEIGHTS[big], f"{big} weights")
    cfg = load_config(None, ["llm.llamacpp.generate_engine=torch-bfloat16", "llm.llamacpp.score_engine=llamacpp"])
    assert llm_weights(cfg, big, "generate")[0] == WEIGHTS[big] + 2 * 1.54e9
    # torch for both kinds of work (the embedded backend without llama.cpp): the GGUF is never loaded
    cfg = load_config(None, ["llm.llamacpp.generate_engine=torch-float32", "llm.llamacpp.score_engine=torch-float32"])
    assert llm_weights(cfg, big, "generate") == (4 * 1.54e9, f"{big} weights in float32 (torch-float32 generates; both engines torch, no GGUF held)")
    assert llm_weights(cfg, "my.gguf", "score") == (0.0, "my.gguf weights (unknown model: not counted)")


def test_prompts_per_cluster_the_writer_and_the_filters_size_the_questions():
    """The reference build: 200 clusters x 2 prompts x 10 questions = 4,000 candidates written by the 1.5B; the filters'
    survival decides how many of a cluster's candidates can fill its top t (5)."""
    from dataclasses import replace

    cfg = load_config("reference")
    p = capacity_plan(cfg)
    c = p["counts"]
    assert (c["generation_prompts"], c["prompts_per_cluster"], c["candidates"], c["writer"]) == (400, 2, 4000, "bundled:qwen2.5-coder-1.5b")
    assert p["stages"][2]["llm_requests"] == 400 and "2 prompt(s) per cluster" in p["stages"][2]["what"]
    assert (c["filter_survival"], c["eligible"], c["selected_top_t"]) == (1.0, 4000, 1000)
    c = capacity_plan(cfg, workload=replace(Workload(), filter_survival=0.1))["counts"]  # 2 of a cluster's 20 pass, on average
    top_t = sum(min(5, x) * math.comb(20, x) * 0.1**x * 0.9 ** (20 - x) for x in range(21))  # E[min(t, Binomial(20, 0.1))]
    assert (c["eligible"], c["selected_top_t"], c["questions"]) == (400, round(200 * top_t), round(round(200 * top_t) * 9_614 / 20_000))
    assert 395 < c["selected_top_t"] < 400  # a cluster with 6 or more passing keeps 5
    # survivals the docs quote (0.065-0.5): the questions grow with the survival, never to 0 (a floor of the mean once
    # made 0.065-0.09 plan m = 0 and 0.1 the same m as 0.15)
    tops = [capacity_plan(cfg, workload=replace(Workload(), filter_survival=f))["counts"]["selected_top_t"] for f in (0.03, 0.065, 0.1, 0.15, 0.5)]
    assert tops == sorted(tops) and len(set(tops)) == 5 and tops[0] > 0
    no_filters = load_config("reference", ["cqg.filters=[]"])
    assert capacity_plan(no_filters, workload=replace(Workload(), filter_survival=0.1))["counts"]["selected_top_t"] == 1000
    with pytest.raises(ValueError, match="filter_survival"):
        capacity_plan(cfg, workload=replace(Workload(), filter_survival=0))


def test_calibrate_reads_the_parse_rate_and_the_filter_survival(tmp_path, capsys):
    """8 prompts asked 10 questions each: 60 parsed (0.75), 3 copies, 27 denied by their cluster and 5 by the opening cap
    of the selection: 25 of 60 survive."""
    from cqg_ray.rundir import RunDir

    root = fake_run(tmp_path, {"labels": (2000, 100, 30.0)})
    run = RunDir(root)
    run.write_manifest("questions", "h", [], {"generation_prompts": 8, "parsed": 60, "dropped_copy": 3, "dropped_own_cluster": 27,
                                             "dropped_opening": 5}, 1.0)
    run.write_bytes("config.yaml", b"cqg:\n  questions_per_prompt: 10\n")
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["workload"]
    assert (w["parse_rate"], w["filter_survival"]) == (0.75, 25 / 60)
    assert main(["plan", "--docs", "10k", "-k", "100", "--calibrate", root, "--filter-survival", "0.3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["filter_survival"] == 0.3  # a figure given wins


def test_memory_table_paper(capsys):
    assert main(["plan", "--config", "paper", "--docs", "6.8M", "--gpus", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "cluster  driver               0.32  the centroids and counters" in out  # the k-means sample is the task's
    assert "cluster  k-means task         5.73  k-means sample 1,280,000 x 1024, centroids, every text's id (to draw the sample)" in out
    assert ("label    driver               0.96  clusters, places, plan arrays (9,614,000 pairs, 2,450,275 prompts), plan table and "
            "Parquet bytes") in out
    assert "label    LLM engine          15.50  Qwen/Qwen2.5-7B-Instruct weights, a batch of texts" in out
    assert "label    ledger index         1.23  every ledger key of 2,450,275 requests, sorted" in out  # packed: one key a prompt
    assert "train    train worker x2      7.03  its shard (1,201,428 embeddings, 4,807,000 labels), heads + grads + Adam" in out
    p = capacity_plan(load_config("paper"), docs=6_800_000)
    # the driver's plan stays under a GB at the paper's 9.6M pairs: 17 bytes a pair + the plan's table and Parquet bytes
    assert memory_row(p, "label", "driver")["bytes"] == 300_000_000 + 6_800_000 * 44 + 9_614_000 * 17 + 2_450_275 * 16 + 2 * (
        9_614_000 * 4 + 2_450_275 * 16)


def test_the_demo_plans_enough_held_out_labels_for_each_question():
    """The demo's label plan leaves each question at least 10 report labels (its figures need train.min_heldout)."""
    from cqg_ray.config import load_config

    cfg = load_config("demo")
    c = capacity_plan(cfg, docs=3000)["counts"]
    assert c["texts_per_question"] == 40
    assert c["heldout_report_per_question"] == round(40 * 0.55 * 0.6, 1) >= 10 >= cfg.train.min_heldout
    assert c["heldout_select_per_question"] == round(40 * 0.55 * 0.4, 1) and c["train_labels_per_question"] == 18.0


def test_the_preset_follows_where_the_configs_llm_runs(capsys):
    """A config with the embedded llama.cpp LLM was planned on an assumed H100 ("1 x GPU (+ 16 CPU cores)", vLLM's
    rates); its default preset is now cpu, gpu for the GPU backends, and --preset says otherwise."""
    for sets, device in (([], "1 x 2-core CPU machine (+ 2 CPU cores"), (["llm.backend=vllm"], "1 x GPU (+ 16 CPU cores"),
                         (["llm.backend=openai"], "1 x GPU (+ 16 CPU cores")):
        assert main(["plan", "--docs", "4000", "--clusters", "30", *[a for s in sets for a in ("--set", s)]]) == 0
        assert device in capsys.readouterr().out.splitlines()[0], sets
    assert main(["plan", "--docs", "4000", "--clusters", "30", "--preset", "gpu"]) == 0
    assert "1 x GPU" in capsys.readouterr().out.splitlines()[0]


def test_calibrate_says_why_a_resumed_encode_gives_no_rate(tmp_path):
    """A run whose encode kept every unit from an earlier run timed nothing: calibrate said "no finished encode ...
    stage" while `cqg-ray status` showed encode done."""
    from cqg_ray.plan.throughput import THROUGHPUTS, calibrate
    from cqg_ray.rundir import RunDir

    RunDir(str(tmp_path)).write_manifest("encode", "h", [], {"documents": 400, "units_resumed": 1, "encoded_now": 0}, 0.0)
    with pytest.raises(ValueError) as e:
        calibrate(str(tmp_path), THROUGHPUTS["cpu"])
    assert str(e.value) == (f"{tmp_path} has no finished encode, LLM or train stage to measure throughput from (its encode "
                            "stage finished without encoding a text itself: every unit was kept from an earlier run, so it timed nothing)")


def test_the_cpu_presets_rates_say_when_the_config_runs_other_models(capsys):
    # the reference config (the 1.5B writes, probes and labels) was planned at the 0.5B's rates, labelled MEASURED:
    # 4.7 hours against the ~21 its own engines take. So were the torch engines, which `auto` picks on most CPUs
    on_llamacpp = ["--set", "llm.llamacpp.score_engine=llamacpp", "--set", "llm.llamacpp.generate_engine=llamacpp"]
    assert main(["plan", "--config", "reference", "--json", *on_llamacpp]) == 0
    source = json.loads(capsys.readouterr().out)["throughput"]["source"]
    assert source.endswith("; NOT measured on this config's bundled:qwen2.5-coder-1.5b: --measure times its engines here (about a "
                           "minute), --calibrate RUN_DIR takes a pilot run's")
    assert main(["plan", "--docs", "10k", "-k", "100", "--set", "llm.backend=llamacpp", "--json", *on_llamacpp]) == 0  # the 0.5B throughout
    assert "NOT measured" not in json.loads(capsys.readouterr().out)["throughput"]["source"]
    assert main(["plan", "--docs", "10k", "-k", "100", "--set", "llm.backend=llamacpp", "--set", "label.model=bundled:smollm2-135m",
                 "--json", *on_llamacpp]) == 0
    assert "NOT measured on this config's bundled:smollm2-135m:" in json.loads(capsys.readouterr().out)["throughput"]["source"]
    assert main(["plan", "--docs", "10k", "-k", "100", "--set", "llm.backend=llamacpp", "--set", "llm.llamacpp.score_engine=torch-float32",
                 "--set", "llm.llamacpp.generate_engine=llamacpp", "--json"]) == 0  # the memory table says torch scores: so does this
    assert "NOT measured on this config's torch-float32 engine (scoring):" in json.loads(capsys.readouterr().out)["throughput"]["source"]


def test_generation_prompts_that_the_guard_clips_are_planned_at_the_context():
    # the default config's generation prompt (~5.8k tokens) is clipped to the 4,096-token context minus its 400-token
    # reply; the table charged all 5.8k a prompt while the same plan said every prompt would be clipped
    p = capacity_plan(config_from_dict({}), docs=100_000)
    gen = stage(p, "cqg-generate")
    assert next(r for r in p["context"] if r["stage"] == "cqg-generate")["verdict"].startswith("every prompt clipped")
    assert gen["prompt_tokens"] == gen["llm_requests"] * (4096 - 400)
    wide = capacity_plan(config_from_dict({"llm": {"llamacpp": {"n_ctx": 16384}}}), docs=100_000)  # it fits: as counted
    assert stage(wide, "cqg-generate")["prompt_tokens"] > gen["prompt_tokens"] * 1.5
