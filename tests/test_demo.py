"""`cqg-ray demo` prints each summary block once, with the copy rate against the run's own corpus (no Ray: the
pipeline is stood in for by the evaluation stage alone, on a toy run whose earlier stages are done)."""

import json
from dataclasses import asdict

import pytest

import cqg_ray.pipeline
import cqg_ray.sizing
from cqg_ray.config import dump_config

STS_PAIRS = [("A man is playing a guitar.", "A man plays the guitar.", 4.8), ("A dog runs in the park.", "A dog is running in a park.", 4.6),
             ("The bank raised interest rates.", "Interest rates were raised by the bank.", 4.4),
             ("A woman is cooking dinner.", "A woman is preparing a meal.", 3.9), ("A child reads a book.", "A kid is reading.", 3.2),
             ("The phone has a big screen.", "The laptop is heavy.", 1.4), ("A cat sleeps on the sofa.", "Stocks fell sharply on Monday.", 0.2),
             ("A man walks down the street.", "The orchestra played a symphony.", 0.0)]


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
    monkeypatch.setattr(cqg_ray.sizing, "LONG_PROMPT_READ", {})  # the reason below, whichever writer engine `auto` picks on this CPU
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
