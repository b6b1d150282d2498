"""The budget sweep's faithfulness axis: its sampling and estimates (pure, exact), and the sweep inside the faithfulness task
on the toy model folder with a scripted judge."""

import json

import numpy as np
import pytest

from cqg_ray.config import EvaluateConfig, FaithfulnessConfig
from cqg_ray.evaluate.faith_sweep import (choose, lowest_floor, rank_label, sample_candidates, sweep_budgets, sweep_figures,
                                          sweep_markdown)
from cqg_ray.evaluate.faithfulness import faithfulness
from cqg_ray.mbqa.budget import Budget, active_mask
from tests.evaluate.test_faithfulness import TEXTS, scripted_judge


def test_sweep_budgets_put_the_model_first_rank_by_mean_only_with_means_and_repeat_nothing():
    own = Budget(rule="top_k", k=8, floor=0.5, value="centred", rank="centred")
    with_mean = sweep_budgets(own, [8, 16], [0.5, 0.8], has_mean=True)
    assert with_mean[0] == own and len(with_mean) == len(set(with_mean)) == 8  # 2 ranks x 2 floors x 2 k; the model's is among them
    assert {(b.rank, b.floor, b.k) for b in with_mean} == {(r, f, k) for r in ("prob", "centred") for f in (0.5, 0.8) for k in (8, 16)}
    assert {b.value for b in with_mean} == {"centred"}
    lifted = sweep_budgets(own, [8, 16], [0.5, 0.8], has_mean=True, lifts=[0.25, 0.5])
    assert lifted[:8] == with_mean and len(lifted) == len(set(lifted)) == 16
    assert {(b.lift, b.floor, b.k) for b in lifted[8:]} == {(x, f, k) for x in (0.25, 0.5) for f in (0.5, 0.8) for k in (8, 16)}
    assert {b.rank for b in lifted[8:]} == {"lift"} and rank_label(lifted[8].to_dict()) == "p - 0.25 mean"
    assert sweep_budgets(own, [8], [0.5], has_mean=False, lifts=[0.5]) == [own, Budget(rule="top_k", k=8, floor=0.5, value="one")]
    plain = sweep_budgets(Budget(rule="tau", tau=0.6), [4], [0.7], has_mean=False)
    assert plain == [Budget(rule="tau", tau=0.6), Budget(rule="top_k", k=4, floor=0.7, value="one", rank="prob")]
    assert lowest_floor(plain) == 0.6 and lowest_floor(with_mean) == 0.5
    assert lowest_floor([Budget(rule="top_k", k=3, floor=None)]) == 0.0


def test_sample_candidates_takes_at_most_per_text_above_the_floor_seeded():
    probs = np.array([[0.9, 0.2, 0.6, 0.7, 0.95], [0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 0.6, 0.1, 0.1, 0.1]])
    picks = sample_candidates(probs, 0.5, 2, seed=3)
    assert picks == sample_candidates(probs, 0.5, 2, seed=3)
    by_row = {r: [q for rr, q in picks if rr == r] for r in range(3)}
    assert len(by_row[0]) == 2 and set(by_row[0]) <= {0, 2, 3, 4} and by_row[0] == sorted(by_row[0])
    assert by_row[1] == [] and by_row[2] == [0, 1]  # 0.5 is not above the floor; a pool smaller than per_text: all of it
    draws = {tuple(q for r, q in sample_candidates(probs, 0.5, 2, seed=s) if r == 0) for s in range(20)}
    assert len(draws) > 1  # random, not the first ones


def test_sweep_figures_by_hand():
    """Two texts, pools of 3 and 1 above 0.5; the first text's sample is 2 of its 3 (weight 3/2), the second's its one
    (weight 1)."""
    probs = np.array([[0.9, 0.8, 0.6, 0.1], [0.2, 0.7, 0.3, 0.4]])
    picks = [(0, 0), (0, 2), (1, 1)]
    yes = [True, False, True]
    top1 = Budget(rule="top_k", k=1, floor=0.5, value="one", rank="prob")   # shows q0 for text 0, q1 for text 1
    top3 = Budget(rule="top_k", k=3, floor=0.5, value="one", rank="prob")   # q0 q1 q2 for text 0, q1 for text 1
    high = Budget(rule="top_k", k=3, floor=0.85, value="one", rank="prob")  # q0 for text 0, none for text 1
    rows = sweep_figures(probs, None, [top1, top3, high], picks, yes, floor=0.5)
    # top1: sampled pairs shown (0,0) yes w 1.5, (1,1) yes w 1 -> 1.0
    assert rows[0]["yes_precision"] == 1.0 and rows[0]["judged"] == 2 and rows[0]["mean_active"] == 1.0
    # top3: (0,0) yes 1.5, (0,2) no 1.5, (1,1) yes 1 -> 2.5 / 4
    assert rows[1]["yes_precision"] == 0.625 and rows[1]["judged"] == 3 and rows[1]["mean_active"] == 2.0
    assert rows[2]["yes_precision"] == 1.0 and rows[2]["judged"] == 1 and rows[2]["texts_without_active_share"] == 0.5
    assert rows[1]["budget"] == "top3>0.5" and (rows[1]["k"], rows[1]["floor"], rows[1]["rank"], rows[1]["tau"]) == (3, 0.5, "prob", None)
    none = sweep_figures(probs, None, [Budget(rule="top_k", k=1, floor=0.95)], picks, yes, floor=0.5)[0]
    assert none["yes_precision"] is None and none["judged"] == 0 and none["mean_active"] == 0.0


def test_a_census_gives_every_budget_the_exact_yes_rate_of_what_it_shows():
    """With per_text at least the pool, every candidate is judged and each estimate is the judge's yes-rate over all the
    (text, question) pairs the budget shows, whatever the budget."""
    rng = np.random.default_rng(0)
    probs = rng.random((40, 30))
    mean = probs.mean(axis=0) * 0.9
    truth = rng.random((40, 30)) < probs  # the judge agrees more with confident heads
    budgets = sweep_budgets(Budget(rule="top_k", k=6, floor=0.5, value="centred", rank="centred"), [2, 5, 10], [0.5, 0.7, 0.9], True)
    picks = sample_candidates(probs, 0.5, 30, seed=0)
    rows = sweep_figures(probs, mean, budgets, picks, [truth[r, q] for r, q in picks], floor=0.5)
    for b, row in zip(budgets, rows):
        act = active_mask(probs, b, mean)
        assert row["yes_precision"] == pytest.approx(round(truth[act].mean(), 4), abs=1e-12), b.name
        assert row["judged"] == int(act.sum())


def test_a_sample_estimates_the_census_without_bias():
    """Averaged over many seeded samples of 3 a text, the estimate of a budget's yes-rate comes within three standard
    errors of the census (the samples' own spread gives the error)."""
    rng = np.random.default_rng(1)
    probs = rng.random((60, 20))
    truth = rng.random((60, 20)) < probs
    b = Budget(rule="top_k", k=4, floor=0.5, value="one", rank="prob")
    census = truth[active_mask(probs, b)].mean()
    est = []
    for seed in range(200):
        picks = sample_candidates(probs, 0.5, 3, seed)
        est.append(sweep_figures(probs, None, [b], picks, [truth[r, q] for r, q in picks], floor=0.5)[0]["yes_precision"])
    est = np.array(est)
    assert abs(est.mean() - census) < 3 * est.std(ddof=1) / np.sqrt(len(est))


def test_choose_asks_for_enough_active_questions_few_texts_without_and_enough_judgements():
    row = lambda name, p, active, without, judged: {"budget": name, "yes_precision": p, "mean_active": active,  # noqa: E731
                                                    "texts_without_active_share": without, "judged": judged}
    rows = [row("own", 0.5, 40, 0.0, 200), row("few", 0.99, 5, 0.0, 100), row("empty", 0.95, 12, 0.2, 100),
            row("thin", 0.97, 12, 0.0, 10), row("good", 0.8, 12, 0.01, 100), row("same", 0.8, 20, 0.0, 100), row("none", None, 0, 1.0, 0)]
    assert choose(rows)["budget"] == "same"  # 0.8 twice: the one that shows more
    assert choose(rows, min_judged=5)["budget"] == "thin"
    assert choose(rows, min_active=50) is None
    md = "\n".join(sweep_markdown({"rows": rows, "chosen": "same", "judged": 300, "per_text": 10, "floor": 0.5, "min_active": 10,
                                   "max_without": 0.05}))
    assert "**same**" in md and md.index("| few") < md.index("| **same**") < md.index("| none")


def test_the_faithfulness_task_sweeps_budgets_with_one_judge_run(toy, tmp_path):
    """Inside the task: the sweep's pairs join the protocol's in one ledger (a pair both draw is asked once), each budget's
    estimate is exact where the sample is a census, and a rerun asks nothing."""
    model = toy.__class__(toy.encoder_name, toy.question_records, toy.heads, tau=toy.tau, encoder=toy.encoder, device="cpu",
                          budget=Budget(rule="top_k", k=3, floor=0.5, value="one", rank="prob"))
    yes = set(toy.questions[::2])
    judge_cfg, backend = scripted_judge(yes)
    cfg = FaithfulnessConfig(n=len(TEXTS), per_text=2, pairs=0, judge=judge_cfg, links=False, sweep_per_text=toy.m,
                             sweep_k=[1, 2, 4], sweep_floors=[0.5, 0.7], sweep_min_active=1, sweep_max_without=0.5, sweep_min_judged=2)
    res = faithfulness(model, TEXTS, cfg, str(tmp_path / "f"), backend=backend, progress=False)
    probs = model.encode(TEXTS, output="probs", progress=False)
    sweep = res["budget_sweep"]
    assert sweep["floor"] == 0.5 and sweep["judged"] == int((probs > 0.5).sum()) > 0
    assert len(backend.calls) == len({(j["text"], j["question"]) for j in res["judgements"]} | {
        (t, q) for t, p in zip(TEXTS, probs) for q, pq in zip(toy.questions, p) if pq > 0.5})
    even = np.zeros(toy.m, dtype=bool)
    even[::2] = True
    for row in sweep["rows"]:
        act = active_mask(probs, Budget.from_dict({k: row[k] for k in ("rule", "k", "floor", "value", "rank")}))
        assert row["yes_precision"] == (round(float(even[np.nonzero(act)[1]].mean()), 4) if act.any() else None)
    assert sweep["rows"][0]["budget"] == model.budget.name
    chosen = choose(sweep["rows"], 1, 0.5, 2)
    assert sweep["chosen"] == chosen["budget"] and Budget.from_dict(sweep["chosen_budget"]).name == chosen["budget"]
    calls = len(backend.calls)
    again = faithfulness(model, TEXTS, cfg, str(tmp_path / "f"), backend=backend, progress=False)
    assert len(backend.calls) == calls and again["budget_sweep"]["rows"] == sweep["rows"]


def test_evaluate_writes_the_sweep_plot_table_and_csv(toy, tmp_path):
    from cqg_ray.config import JudgeLLMConfig
    from cqg_ray.evaluate.report import evaluate_model

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    model = toy.__class__(toy.encoder_name, toy.question_records, toy.heads, tau=toy.tau, encoder=toy.encoder, device="cpu",
                          budget=Budget(rule="top_k", k=3, floor=0.5, value="one", rank="prob"))
    cfg = EvaluateConfig(tasks=["faithfulness"], faithfulness=FaithfulnessConfig(texts=[str(texts)], n=6, pairs=0, links=False,
                                                                                judge=JudgeLLMConfig(backend="fake"), sweep_per_text=4,
                                                                                sweep_k=[1, 3], sweep_floors=[0.5]))
    out = tmp_path / "report"
    evaluate_model({"Toy": model}, cfg, str(out), print_table=False)
    assert (out / "faithfulness_sweep_toy_texts.png").read_bytes()[:4] == b"\x89PNG"
    csv = (out / "faithfulness_sweep_toy_texts.csv").read_text().splitlines()
    assert csv[0].startswith("budget,rule,tau,k,floor,value,rank,lift,yes_precision,judged") and len(csv) == 1 + 2  # own (top3>0.5) + top1
    report = (out / "report.md").read_text()
    assert "Budget sweep, faithfulness axis" in report and "faithfulness_sweep_toy_texts.png" in report
