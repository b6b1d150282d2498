"""The faithfulness task: its sampling and figures (pure), and the whole task on a real model folder with a scripted judge
whose answers are known, so that the figures come out exactly."""

import json
import logging

import numpy as np
import pytest

from cqg_ray.config import EvaluateConfig, FaithfulnessConfig, JudgeLLMConfig, LLMConfig
from cqg_ray.evaluate.faithfulness import (ACTIVE, CAP, FIGURES, LINKS, MORE_FIGURES, NO, answered_threshold, faithfulness,
                                           format_faithfulness, labeller_checks, link_figures, nearest_pairs, pools, protocol_figures,
                                           same_model, sample_pools, sample_texts, with_links_labeller)
from cqg_ray.llm.base import Completion
from cqg_ray.llm.engines.fake import FakeBackend
from cqg_ray.llm.prompts import judge_shot_messages

TEXTS = [
    "The hospital opened a new wing for heart surgery.",
    "A thrilling film with a weak ending.",
    "Grilled salmon with lemon and herbs.",
    "Parliament passed the budget after a long debate.",
    "The new laptop runs the software smoothly.",
    "A quiet walk through the forest at dawn.",
    "Doctors warn about the flu season.",
    "The band played their greatest hits in Paris.",
]


# ----------------------------------------------------------------------------------------- pure core


def test_sample_texts_is_seeded_sorted_and_capped():
    a = sample_texts(100, 10, seed=3)
    assert a.tolist() == sorted(a.tolist()) and len(set(a.tolist())) == 10
    assert a.tolist() == sample_texts(100, 10, seed=3).tolist() != sample_texts(100, 10, seed=4).tolist()
    assert sample_texts(4, 10, seed=0).tolist() == [0, 1, 2, 3]


def test_the_pools_and_the_threshold_of_each_budget():
    from cqg_ray.mbqa.budget import Budget

    assert answered_threshold(Budget(rule="tau", tau=0.76)) == 0.76
    assert answered_threshold(Budget(rule="top_k", k=3, floor=0.6)) == 0.6
    assert answered_threshold(Budget(rule="top_k", k=3, floor=None)) == 0.5
    act = np.array([[1, 0, 0, 1], [0, 0, 1, 0]], dtype=bool)
    probs = np.array([[0.9, 0.7, 0.5, 0.3], [0.6, 0.2, 0.55, 0.5]])
    # shown -> ACTIVE whatever p (row 0's q3 under a budget without a floor); above 0.5 not shown -> CAP; at 0.5 -> NO
    assert pools(act, probs, 0.5).tolist() == [[ACTIVE, CAP, NO, ACTIVE], [CAP, NO, ACTIVE, NO]]


def test_sample_pools_takes_everything_when_the_pools_are_small():
    pool = np.array([[ACTIVE, NO, ACTIVE, CAP], [NO, NO, NO, NO]], dtype=np.int8)
    assert sample_pools(pool, per_text=5, seed=0) == [
        (0, 0, ACTIVE), (0, 2, ACTIVE), (0, 1, NO), (0, 3, CAP),
        (1, 0, NO), (1, 1, NO), (1, 2, NO), (1, 3, NO),
    ]


def test_sample_pools_is_random_not_the_first_ones():
    pool = np.full((50, 60), NO, dtype=np.int8)
    pool[:, :20] = ACTIVE
    pool[:, 20:30] = CAP  # 20 active, 10 cut by the cap, 30 answered no a text
    picks = sample_pools(pool, per_text=5, seed=0)
    assert len(picks) == 50 * 15
    for row in range(50):
        mine = [(q, k) for r, q, k in picks if r == row]
        assert [k for _, k in mine] == [ACTIVE] * 5 + [NO] * 5 + [CAP] * 5
        assert all(pool[row, q] == k for q, k in mine)
    assert {q for _, q, k in picks if k == ACTIVE} == set(range(20))  # over 50 texts every active question is drawn somewhere
    assert picks == sample_pools(pool, per_text=5, seed=0) != sample_pools(pool, per_text=5, seed=1)


def test_protocol_figures_by_hand():
    # text 0: 2 shown, 1 answered no, 3 cut by the cap; text 1: nothing shown, 6 answered no (2 judged)
    pool = np.array([[ACTIVE, ACTIVE, NO, CAP, CAP, CAP], [NO] * 6], dtype=np.int8)
    picks = [(0, 0, ACTIVE), (0, 1, ACTIVE), (0, 2, NO), (0, 3, CAP), (0, 4, CAP), (1, 0, NO), (1, 1, NO)]
    judge = [True, False, False, True, True, True, False]
    f = protocol_figures(picks, judge, pool, per_text=2)
    assert f["faithfulness_yes_precision"] == 0.5
    assert f["faithfulness_inactive_yes_rate"] == pytest.approx(1 / 3)  # 1 of the 3 answered-no judgements
    assert f["faithfulness_balanced_accuracy"] == pytest.approx((0.5 + 1 - 1 / 3) / 2)
    assert f["faithfulness_cap_left_out_yes_rate"] == 1.0
    assert f["faithfulness_mean_active"] == 1.0 and f["faithfulness_texts_without_active_share"] == 0.5
    # the old rule: text 0's 4 not shown = 1 no (yes-rate 0) + 3 cap (yes-rate 1) -> 3/4, drawn 2 of them; text 1's 6 not
    # shown, all no (yes-rate 1/2), drawn 2 -> (2 * 3/4 + 2 * 1/2) / 4
    old = (2 * 0.75 + 2 * 0.5) / 4
    assert f["faithfulness_old_rule_inactive_yes_rate"] == pytest.approx(old)
    assert f["faithfulness_old_rule_balanced_accuracy"] == pytest.approx((0.5 + 1 - old) / 2)
    assert (f["judged_active"], f["judged_inactive"], f["judged_cap_left_out"]) == (2, 3, 2)
    none = protocol_figures([(0, 0, NO)], [True], np.array([[NO]]), per_text=5)
    assert none["faithfulness_yes_precision"] is None and none["faithfulness_balanced_accuracy"] is None
    assert none["faithfulness_inactive_yes_rate"] == 1.0 and none["faithfulness_cap_left_out_yes_rate"] is None


def test_link_figures_by_hand():
    kinds = [ACTIVE, ACTIVE, CAP, NO, NO]
    judge = [True, False, True, False, True]
    labeller = [True, True, True, False, False]
    f = link_figures(kinds, judge, labeller)
    assert f["faithfulness_link_labeller_judge"] == 0.6  # agree on pairs 0, 2, 3
    assert f["faithfulness_link_head_labeller"] == 1.0  # head yes on ACTIVE and CAP: exactly the labeller's yes
    assert f["faithfulness_link_budget_head"] == 0.8  # the CAP pair: the head says yes, the budget does not show it
    assert f["judge_confirms_labeller_yes"] == pytest.approx(2 / 3)
    assert f["judge_confirms_head_yes"] == pytest.approx(2 / 3) and f["judge_confirms_shown"] == 0.5


def test_same_model_reads_past_bundled_folders_and_case():
    assert same_model("bundled:qwen2.5-coder-1.5b", "/models/Qwen2.5-Coder-1.5B/")
    assert same_model("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct")
    assert not same_model("bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b")


def test_labeller_checks_name_a_judge_that_labelled_and_links_that_asked_another_model():
    lab15 = {"backend": "llamacpp", "model": "bundled:qwen2.5-coder-1.5b", "answer_mode": "single", "prompt": "answer", "yes_above": 0.5}
    cfg = FaithfulnessConfig()  # judge: the bundled 1.5B; links' labeller: the bundled 0.5B
    assert labeller_checks(None, cfg, True) == {"labelled_by": None, "judge_is_labeller": None, "links_labeller_differs": None}
    assert labeller_checks(lab15, cfg, True) == {"labelled_by": lab15, "judge_is_labeller": True, "links_labeller_differs": True}
    assert labeller_checks(lab15, cfg, False)["links_labeller_differs"] is None
    lab05 = {**lab15, "model": "bundled:qwen2.5-coder-0.5b"}
    assert labeller_checks(lab05, cfg, True) == {"labelled_by": lab05, "judge_is_labeller": False, "links_labeller_differs": False}


def test_the_links_ask_the_recorded_embedded_labeller_unless_one_is_set():
    lab15 = {"backend": "llamacpp", "model": "bundled:qwen2.5-coder-1.5b", "answer_mode": "packed", "prompt": "answer", "yes_above": 0.5}
    cfg = FaithfulnessConfig()
    own = with_links_labeller(cfg, lab15).labeller
    assert (own.backend, own.llamacpp.model, own.answer_mode) == ("llamacpp", "bundled:qwen2.5-coder-1.5b", "packed")
    assert own.llamacpp.score_engine == cfg.labeller.llamacpp.score_engine and cfg.labeller.llamacpp.model == "bundled:qwen2.5-coder-0.5b"
    assert labeller_checks(lab15, with_links_labeller(cfg, lab15), True)["links_labeller_differs"] is False
    assert with_links_labeller(cfg, None) is cfg
    assert with_links_labeller(cfg, {**lab15, "backend": "openai"}) is cfg  # a server's address is not in the record
    chosen = FaithfulnessConfig(labeller=LLMConfig(llamacpp={"model": "bundled:qwen2.5-coder-0.5b"}, answer_mode="packed"))
    assert with_links_labeller(chosen, lab15) is chosen  # one set by hand is asked as set


def test_the_links_ask_with_the_recorded_engine_prompt_and_threshold_unless_set():
    rec = {"backend": "llamacpp", "model": "bundled:qwen2.5-coder-1.5b", "answer_mode": "single", "prompt": "judge",
           "yes_above": 0.162, "score_engine": "torch-float32"}
    own = with_links_labeller(FaithfulnessConfig(), rec)
    assert (own.labeller.llamacpp.model, own.labeller.llamacpp.score_engine) == ("bundled:qwen2.5-coder-1.5b", "torch-float32")
    assert (own.labeller_prompt, own.labeller_yes_above) == ("judge", 0.162)
    assert own.labeller.llamacpp.generate_engine == FaithfulnessConfig().labeller.llamacpp.generate_engine  # only what it recorded
    # a record without an engine (an older model folder) leaves the default engine setting
    older = with_links_labeller(FaithfulnessConfig(), {k: v for k, v in rec.items() if k != "score_engine"})
    assert older.labeller.llamacpp.score_engine == "auto" and older.labeller_prompt == "judge"
    # a server labeller (not in the record) keeps its settings but is asked with the recorded prompt and threshold
    served = with_links_labeller(FaithfulnessConfig(), {**rec, "backend": "openai"})
    assert served.labeller == LLMConfig() and (served.labeller_prompt, served.labeller_yes_above) == ("judge", 0.162)
    # set by hand: asked as set
    chosen = FaithfulnessConfig(labeller_prompt="judge", labeller_yes_above=0.3)
    assert with_links_labeller(chosen, {**rec, "prompt": "answer", "backend": "openai"}) is chosen
    # packed answers have no judge's prompt: the record's prompt applies to single-pass links only
    packed = with_links_labeller(FaithfulnessConfig(labeller=LLMConfig(answer_mode="packed")), rec)
    assert packed.labeller_prompt == "answer" and packed.labeller_yes_above == 0.162
    # a record of the defaults changes nothing
    assert with_links_labeller(FaithfulnessConfig(), {**rec, "backend": "fake", "prompt": "answer", "yes_above": 0.5}) == FaithfulnessConfig()


def test_nearest_pairs_by_binary_cosine_skip_texts_without_yes():
    act = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]], dtype=bool)
    # row 0: cos with 2 = 1/sqrt2 = 0.707, with 3 = 2/sqrt6 = 0.816 -> 3; row 1 has no yes; row 2: with 0 = 0.707,
    # with 3 = 0.577 -> 0; row 3: with 0 = 0.816 -> 0
    assert nearest_pairs(act, 3) == [(0, 3), (2, 0), (3, 0)]
    assert nearest_pairs(act, 0) == []


# ----------------------------------------------------------------------------------------- the task, on a real model


def scripted_judge(yes_questions: set[str]):
    """A judge that says yes exactly to the questions in ``yes_questions``, whatever the text."""
    cfg = JudgeLLMConfig(backend="fake")

    def reply(req):
        question = req.messages[-1]["content"].rsplit("\n\nQuestion: ", 1)[1]
        p = 0.9 if question in yes_questions else 0.1
        return Completion("yes" if p > 0.5 else "no", prompt_tokens=10, p_yes=[p])

    return cfg, FakeBackend(cfg, reply=reply)


def scripted_labeller(yes_ids: set[int]):
    """A labelling LLM that says yes exactly to the question indices in ``yes_ids``, whatever the text."""
    cfg = LLMConfig(backend="fake")

    def reply(req):
        p = 0.8 if req.meta["question_ids"][0] in yes_ids else 0.2
        return Completion("yes" if p > 0.5 else "no", prompt_tokens=10, p_yes=[p])

    return cfg, FakeBackend(cfg, reply=reply)


def test_the_links_ask_as_the_model_was_labelled_its_prompt_and_threshold(toy, tmp_path, monkeypatch):
    """A model labelled with the judge's prompt and a label yes above 0.7: the links ask that prompt and read that
    threshold (from the model's record), so a labeller P(yes) of 0.6 is a no and 0.8 a yes."""
    monkeypatch.setattr(toy, "labelled_by", {"backend": "fake", "model": "fake", "answer_mode": "single", "prompt": "judge",
                                             "yes_above": 0.7}, raising=False)
    judge_cfg, backend = scripted_judge(set())
    lab_cfg = LLMConfig(backend="fake")

    def reply(req):  # 0.8 for every fourth question, 0.6 for the other even ones, 0.2 for the odd ones
        q = req.meta["question_ids"][0]
        p = 0.8 if q % 4 == 0 else 0.6 if q % 2 == 0 else 0.2
        return Completion("yes" if p > 0.5 else "no", prompt_tokens=10, p_yes=[p])

    labeller = FakeBackend(lab_cfg, reply=reply)
    cfg = FaithfulnessConfig(n=3, per_text=toy.m, pairs=0, judge=judge_cfg, labeller=lab_cfg)
    res = faithfulness(toy, TEXTS, cfg, str(tmp_path), backend=backend, progress=False, labeller=labeller)
    assert [j["labeller_yes"] for j in res["judgements"]] == [j["question_index"] % 4 == 0 for j in res["judgements"]]
    # the judge's prompt after its worked examples, the reply unbegun, once per judged (text, question)
    asked = sorted(json.dumps(c.messages) for c in labeller.calls)
    assert asked == sorted(json.dumps(judge_shot_messages(j["text"], j["question"])) for j in res["judgements"])
    assert all(c.yes_no and c.answer_prefix == "" for c in labeller.calls)
    assert res["labeller"] == "fake fake (single, the judge's prompt, yes above 0.7)"


def test_faithfulness_figures_come_out_exactly_with_a_known_judge(toy, tmp_path):
    qs = toy.questions
    yes = set(qs[::2])  # the judge confirms every even-numbered question, on any text
    judge_cfg, backend = scripted_judge(yes)
    lab_cfg, labeller = scripted_labeller(set(range(0, toy.m, 4)))  # the labeller says yes to every fourth question
    cfg = FaithfulnessConfig(n=len(TEXTS), per_text=toy.m, pairs=2, judge=judge_cfg, labeller=lab_cfg)  # per_text = m: every question judged
    res = faithfulness(toy, TEXTS, cfg, str(tmp_path / "ledger"), backend=backend, progress=False, labeller=labeller)

    bits = toy.encode(TEXTS, progress=False).astype(bool)  # the model's default output (tau 0.5), computed here independently
    even = np.zeros(toy.m, dtype=bool)
    even[::2] = True
    x = (bits & even).sum() / bits.sum()
    y = (~bits & even).sum() / (~bits).sum()
    assert (res["judged_active"], res["judged_inactive"], res["judged_cap_left_out"]) == (int(bits.sum()), int((~bits).sum()), 0)
    assert res["faithfulness_yes_precision"] == pytest.approx(x, abs=1e-12)
    assert res["faithfulness_inactive_yes_rate"] == pytest.approx(y, abs=1e-12)
    assert res["faithfulness_balanced_accuracy"] == pytest.approx((x + 1 - y) / 2, abs=1e-12)
    assert res["faithfulness_cap_left_out_yes_rate"] is None  # the tau rule has no cap
    assert res["faithfulness_old_rule_inactive_yes_rate"] == pytest.approx(y, abs=1e-12)  # ... so the old rule is the new one
    assert res["faithfulness_mean_active"] == pytest.approx(bits.sum(axis=1).mean(), abs=1e-3)
    assert res["faithfulness_texts_without_active_share"] == pytest.approx((~bits.any(axis=1)).mean(), abs=1e-4)
    assert res["texts"] == len(TEXTS) and res["texts_without_active"] == int((~bits.any(axis=1)).sum())
    assert bits.sum() > 0 and (~bits).sum() > 0
    # the links on every (text, question): the labeller (every fourth) against the judge (every even), the head against the
    # labeller; the budget shows everything the head says yes to under the tau rule
    fourth = np.zeros(toy.m, dtype=bool)
    fourth[::4] = True
    assert res["faithfulness_link_labeller_judge"] == pytest.approx((fourth == even).mean(), abs=1e-12)
    assert res["faithfulness_link_head_labeller"] == pytest.approx((bits == fourth).mean(), abs=1e-12)
    assert res["faithfulness_link_budget_head"] == 1.0
    assert all(j["labeller_yes"] == (j["question_index"] % 4 == 0) for j in res["judgements"])
    assert len(labeller.calls) == len(TEXTS) * toy.m and labeller.calls[0].yes_no and labeller.calls[0].max_tokens == 1

    # the judge was asked its prompt after the worked examples, single-pass, once per (text, question)
    first = backend.calls[0]
    assert first.yes_no and first.answer_prefix == "" and first.max_tokens == 1
    assert any(c.messages == judge_shot_messages(TEXTS[0], qs[0]) for c in backend.calls)
    assert len(backend.calls) == len(TEXTS) * toy.m

    # explained pairs: built as explain builds them, each shown shared question with the judge's verdict on both texts
    assert len(res["pairs"]) == 2
    for p in res["pairs"]:
        ex = toy.explain(p["text_a"], p["text_b"])
        assert [s["index"] for s in p["shared"]] == [q.index for q in ex.shared_yes][: cfg.pair_questions]
        assert p["cognitive_load"] == ex.cognitive_load
        assert all(s["judge_a"] == s["judge_b"] == (s["question"] in yes) for s in p["shared"])

    lines = format_faithfulness("toy on T", res).splitlines()
    assert lines[1:4] == [f"faithfulness_yes_precision: {x:.4f}", f"faithfulness_inactive_yes_rate: {y:.4f}",
                          f"faithfulness_balanced_accuracy: {(x + 1 - y) / 2:.4f}"]
    named = [ln.split(":")[0] for ln in lines[1:]]
    assert named == list(FIGURES + MORE_FIGURES + LINKS)
    assert "faithfulness_cap_left_out_yes_rate: n/a" in lines


def test_a_top_k_budget_samples_the_cap_apart(toy, tmp_path):
    """Under a top-k budget with a floor the questions above it that the cap cut are their own pool, judged and reported
    apart; answered no means at or below the floor."""
    from cqg_ray.mbqa.budget import Budget

    judge_cfg, backend = scripted_judge(set(toy.questions[::3]))
    model = toy.__class__(toy.encoder_name, toy.question_records, toy.heads, tau=toy.tau, encoder=toy.encoder, device="cpu",
                          budget=Budget(rule="top_k", k=1, floor=0.3, value="one", rank="prob"))
    cfg = FaithfulnessConfig(n=len(TEXTS), per_text=toy.m, pairs=0, judge=judge_cfg, links=False)
    res = faithfulness(model, TEXTS, cfg, str(tmp_path), backend=backend, progress=False)
    probs = model.encode(TEXTS, output="probs", progress=False)
    shown = model.apply(probs)[0].astype(bool)
    cap, no = (probs > 0.3) & ~shown, probs <= 0.3
    assert shown.sum(axis=1).max() == 1 and cap.sum() > 0
    assert (res["judged_active"], res["judged_inactive"], res["judged_cap_left_out"]) == (int(shown.sum()), int(no.sum()), int(cap.sum()))
    third = np.zeros(toy.m, dtype=bool)
    third[::3] = True
    assert res["faithfulness_cap_left_out_yes_rate"] == pytest.approx((cap & third).sum() / cap.sum(), abs=1e-12)
    assert res["faithfulness_inactive_yes_rate"] == pytest.approx((no & third).sum() / no.sum(), abs=1e-12)
    assert res["threshold"] == 0.3 and res["labeller"] is None and "faithfulness_link_budget_head" not in res
    assert {j["pool"] for j in res["judgements"]} == {"active", "no", "cap"}


def test_faithfulness_samples_at_most_per_text_and_resumes_without_asking_again(toy, tmp_path):
    judge_cfg, backend = scripted_judge(set(toy.questions[:5]))
    lab_cfg, labeller = scripted_labeller({1, 2})
    cfg = FaithfulnessConfig(n=6, per_text=2, pairs=0, judge=judge_cfg, labeller=lab_cfg)
    res = faithfulness(toy, TEXTS, cfg, str(tmp_path), seed=1, backend=backend, progress=False, labeller=labeller)
    rows = sample_texts(len(TEXTS), 6, seed=1)
    bits = toy.encode([TEXTS[i] for i in rows], progress=False).astype(bool)
    assert res["judged_active"] == int(np.minimum(bits.sum(axis=1), 2).sum())
    assert res["judged_inactive"] == int(np.minimum((~bits).sum(axis=1), 2).sum())
    assert len(backend.calls) == len(labeller.calls) == res["judged_active"] + res["judged_inactive"]
    assert [j["active"] for j in res["judgements"]].count(True) == res["judged_active"]

    again_cfg, again = scripted_judge(set(toy.questions[:5]))
    _, labeller_again = scripted_labeller({1, 2})
    res2 = faithfulness(toy, TEXTS, cfg, str(tmp_path), seed=1, backend=again, progress=False, labeller=labeller_again)
    assert again.calls == [] and labeller_again.calls == []  # every judgement and label came from the ledger
    assert res2["faithfulness_link_labeller_judge"] == res["faithfulness_link_labeller_judge"]
    assert {k: res2[k] for k in ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate")} == \
        {k: res[k] for k in ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate")}


def test_fewer_texts_than_n_are_all_judged_and_said(toy, tmp_path, caplog):
    judge_cfg, backend = scripted_judge(set(toy.questions[::2]))
    lab_cfg, labeller = scripted_labeller(set())
    cfg = FaithfulnessConfig(n=len(TEXTS) + 5, per_text=1, pairs=0, judge=judge_cfg, labeller=lab_cfg)
    with caplog.at_level(logging.INFO, logger="cqg_ray"):
        res = faithfulness(toy, TEXTS, cfg, str(tmp_path / "ledger"), backend=backend, progress=False, labeller=labeller)
    assert res["texts"] == len(TEXTS)
    assert (f"faithfulness: judging all {len(TEXTS)} texts, fewer than n={len(TEXTS) + 5} (the files' texts, blank ones and "
            "repeats left out)") in [r.getMessage() for r in caplog.records]


def test_a_failing_judge_is_a_clear_error(toy, tmp_path):
    cfg = FaithfulnessConfig(n=2, per_text=1, pairs=0, judge=JudgeLLMConfig(backend="fake", max_attempts=1))
    broken = FakeBackend(cfg.judge, reply=lambda req: Completion("", error="server said 500"))
    with pytest.raises(RuntimeError, match="the judge failed on 4 of 4 judgements"):
        faithfulness(toy, TEXTS, cfg, str(tmp_path), backend=broken, progress=False)


def test_a_judge_that_cannot_load_is_said_before_any_text_is_encoded(tmp_path, capsys):
    """--judge naming no bundled model and no GGUF file: one line (exit 2) before the model loads (a model folder that
    is not there is not what it says), where it was a traceback from the engine once every text was encoded; the
    labeller the links ask is checked too."""
    from cqg_ray.cli import main

    texts = tmp_path / "t.jsonl"
    texts.write_text(json.dumps({"text": "hello world"}) + "\n")
    nowhere = str(tmp_path / "no-model")
    for judge, said in [("/nonexistent/model.gguf", "GGUF model not found: /nonexistent/model.gguf (a path, a hub"),
                        ("bundled:nosuch", "unknown bundled model 'nosuch'")]:
        assert main(["evaluate", nowhere, "--tasks", "faithfulness", "--texts", str(texts), "--judge", judge]) == 2
        assert capsys.readouterr().err.startswith(f"error: evaluate.faithfulness.judge.llamacpp.model: {said}")
    assert main(["evaluate", nowhere, "--tasks", "faithfulness", "--texts", str(texts),
                 "--set", "evaluate.faithfulness.labeller.llamacpp.model=bundled:nosuch"]) == 2
    assert capsys.readouterr().err.startswith("error: evaluate.faithfulness.labeller.llamacpp.model: unknown bundled model")


def test_evaluate_with_the_faithfulness_task_writes_figures_quality_and_the_judge(toy, tmp_path, capsys):
    from cqg_ray.evaluate.report import evaluate_model

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = EvaluateConfig(tasks=["faithfulness"], faithfulness=FaithfulnessConfig(texts=[str(texts)], n=4, pairs=1,
                                                                                judge=JudgeLLMConfig(backend="fake"),
                                                                                labeller=LLMConfig(backend="fake")))
    out = tmp_path / "report"
    res = evaluate_model({"Toy": toy}, cfg, str(out), print_table=True)
    f = res["faithfulness"]["Toy"]["texts"]
    assert f["texts"] == 4 and f["judge"] == "fake fake"
    assert set(res["methods"]) == {"Toy"}  # no baselines without a table task
    assert res["datasets"]["faithfulness"]["texts"] == {"path": str(texts), "texts": len(TEXTS)}
    stored = json.loads((out / "results.json").read_text())
    assert stored["faithfulness"]["Toy"]["texts"]["faithfulness_balanced_accuracy"] == f["faithfulness_balanced_accuracy"]
    q = stored["question_quality"]["Toy"]
    assert q["questions"] == toy.m and q["copy_rate"] is None  # the toy folder names no corpus
    report = (out / "report.md").read_text()
    assert "## Faithfulness" in report and "Judge: fake fake." in report and "## Question quality" in report
    printed = capsys.readouterr().out
    assert f"faithfulness_yes_precision: {f['faithfulness_yes_precision']:.4f}" in printed
    for name in FIGURES + MORE_FIGURES + LINKS:  # each figure on its own line and in results.json
        assert name in stored["faithfulness"]["Toy"]["texts"], name
        assert any(line.startswith(f"{name}: ") for line in printed.splitlines()), name
    assert (out / "faithfulness" / "llm" / "ledger" / "faithfulness-labeller" / "_stats.json").exists()
    assert (out / "faithfulness" / "llm" / "ledger" / "faithfulness" / "_stats.json").exists()
    assert f["judge_is_labeller"] is None and "warning" not in report  # the toy folder names no labeller


def test_a_judge_that_labelled_the_model_is_named_in_the_figures_and_the_report(toy, tmp_path, capsys, monkeypatch):
    from cqg_ray.evaluate.report import evaluate_model

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    monkeypatch.setattr(toy, "labelled_by", {"backend": "fake", "model": "fake", "answer_mode": "single", "prompt": "answer",
                                             "yes_above": 0.5}, raising=False)
    cfg = EvaluateConfig(tasks=["faithfulness"], faithfulness=FaithfulnessConfig(texts=[str(texts)], n=4, pairs=0,
                                                                                judge=JudgeLLMConfig(backend="fake"), links=False))
    res = evaluate_model({"Toy": toy}, cfg, str(tmp_path / "report"), print_table=True)
    f = res["faithfulness"]["Toy"]["texts"]
    assert (f["judge_is_labeller"], f["links_labeller_differs"], f["labelled_by"]["model"]) == (True, None, "fake")
    warning = ("warning: the judge is the model that labelled this model's training texts (fake): the heads learned its "
               "answers, errors included, and it confirms them")
    assert warning in capsys.readouterr().out
    assert f"**{warning}" in (tmp_path / "report" / "report.md").read_text()


def test_cli_faithfulness_options():
    import argparse

    from cqg_ray.evaluate.cli import add_commands, config_from_args

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evaluate", "m", "--tasks", "faithfulness", "--texts", "a.jsonl", "--n", "20", "--per-text", "3",
                              "--pairs", "1", "--judge", "/models/judge.gguf"])
    cfg = config_from_args(args)
    f = cfg.faithfulness
    assert cfg.tasks == ["faithfulness"] and f.texts == ["a.jsonl"] and (f.n, f.per_text, f.pairs) == (20, 3, 1)
    assert f.judge.backend == "llamacpp" and f.judge.llamacpp.model == "/models/judge.gguf"
    args = parser.parse_args(["evaluate", "m", "--tasks", "faithfulness", "--judge", "Qwen/Qwen2.5-7B-Instruct",
                              "--set", "evaluate.faithfulness.judge.backend=openai"])
    f = config_from_args(args).faithfulness
    assert f.judge.openai.model == "Qwen/Qwen2.5-7B-Instruct" and f.judge.llamacpp.model == "bundled:qwen2.5-coder-1.5b"
    default = config_from_args(parser.parse_args(["evaluate", "m"]))
    assert default.tasks == ["sts", "retrieval", "clustering"] and default.faithfulness.judge.llamacpp.model == "bundled:qwen2.5-coder-1.5b"
