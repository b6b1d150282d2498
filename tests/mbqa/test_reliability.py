"""Each question's measured reliability (cqg_ray.mbqa.reliability, no Ray): the split, Platt scaling folded into the
heads, the calibration error, AUC, the drop rule and the per-question figures on the report part."""

import numpy as np
import pytest
import torch

from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.reliability import (REPORT, SELECT, Rules, auc, counts, ece, format_reliability, macro_f1, platt, reliability, sigmoid,
                                      split_heldout)


def test_split_heldout_is_seeded_and_keeps_both_parts():
    a = split_heldout(10, 0.5, seed=0)
    assert a.dtype == bool and a.sum() == 5 and np.array_equal(a, split_heldout(10, 0.5, seed=0))
    assert not np.array_equal(a, split_heldout(10, 0.5, seed=1))
    assert split_heldout(3, 0.1).sum() == 1 and split_heldout(3, 0.9).sum() == 2  # at least one in each part
    assert split_heldout(4, 0.0).sum() == 0 and split_heldout(4, 1.0).sum() == 4
    assert len(split_heldout(0, 0.5)) == 0


def test_platt_recovers_a_known_scaling():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, 20000)
    y = rng.random(20000) < sigmoid(0.5 * z - 1.0)  # the true P(yes) is sigma(0.5 z - 1)
    a, b = platt(z, y)
    assert a == pytest.approx(0.5, abs=0.03) and b == pytest.approx(-1.0, abs=0.05)
    assert platt(z, np.ones_like(y)) == (1.0, 0.0)  # one class: nothing to fit
    assert platt(z[:0], y[:0]) == (1.0, 0.0)
    assert platt(z, rng.random(20000) < sigmoid(-z)) == (1.0, 0.0)  # a reversing fit is refused


def test_ece_by_hand():
    p = np.array([0.05, 0.15, 0.95, 0.95])
    y = np.array([0, 1, 1, 0])
    # bins: [0, .1) {0.05: y 0} gap .05; [.1, .2) {0.15: y 1} gap .85; [.9, 1] {.95, .95: y 1, 0} gap |1.9 - 1| = .9
    assert ece(p, y) == pytest.approx((0.05 + 0.85 + 0.9) / 4)
    assert ece(np.array([1.0]), np.array([1])) == 0.0  # p = 1 falls in the last bin
    assert ece(p[:0], y[:0]) is None


def test_auc_and_counts_per_question():
    q = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    y = np.array([1, 1, 0, 0, 1, 0, 0, 1, 1])
    s = np.array([0.9, 0.4, 0.5, 0.1, 0.3, 0.3, 0.2, 0.5, 0.6])
    got = auc(q, y, s, 4)
    assert got[0] == pytest.approx(0.75)  # pos {.9, .4} vs neg {.5, .1}: 3 of 4 pairs ordered
    assert got[1] == pytest.approx(0.75)  # .3 vs {.3, .2}: a tie (half) and a win
    assert np.isnan(got[2]) and np.isnan(got[3])  # one class; no pairs
    c = counts(q, y, s > 0.45, 4)
    assert {k: v.tolist() for k, v in c.items()} == {"n": [4, 3, 2, 0], "yes": [2, 1, 2, 0], "tp": [1, 0, 2, 0], "fp": [1, 0, 0, 0],
                                                     "fn": [1, 1, 0, 0]}
    # macro-F1 per question: q0 yes F1 .5, no F1 .5 -> .5; q1 yes F1 0, no F1 (tn 2: 4/5) -> .4
    assert macro_f1(c, np.array([True, True, False, False])) == pytest.approx((0.5 + 0.4) / 2)
    assert macro_f1(c, np.zeros(4, bool)) is None


def test_calibrated_and_subset_heads_fold_exactly():
    torch.manual_seed(0)
    heads = StackedHeads(6, 4, 3)
    x = torch.randn(10, 6)
    z = heads(x)
    cal = heads.calibrated(0.5, -1.25)
    assert torch.allclose(cal(x), 0.5 * z - 1.25, atol=1e-6) and torch.equal(heads(x), z)  # the original is untouched
    sub = heads.subset(np.array([True, False, True, True]))
    assert sub.m == 3 and torch.allclose(sub(x), z[:, [0, 2, 3]], atol=1e-6)
    with pytest.raises(ValueError, match="positive"):
        heads.calibrated(0.0, 1.0)
    with pytest.raises(ValueError, match="at least one true"):
        heads.subset(np.zeros(4, bool))


def held_out(rng, m=4, per_q=60):
    """Held-out pairs of m questions: q0 learnt well, q1 at random, q2 learnt but over-confident, q3 learnt; the logits
    are the heads' (a calibration of sigma(0.5 z - 1) fits all)."""
    q = np.repeat(np.arange(m), per_q)
    y = (rng.random(len(q)) < 0.4).astype(np.int64)
    z = np.where(y == 1, 3.0, -1.0) + rng.normal(0, 1.5, len(q))
    z[q == 1] = rng.normal(0, 2, per_q)  # q1: the logit says nothing about the answer
    part = np.where(rng.random(len(q)) < 0.5, SELECT, REPORT)
    return q, y, z, part


def test_reliability_calibrates_drops_and_measures_on_the_report_part():
    rng = np.random.default_rng(1)
    q, y, z, part = held_out(rng)
    train_labels, train_yes = np.array([40, 40, 40, 40]), np.array([10, 12, 9, 40])  # q3: every training answer yes
    rules = Rules(threshold=0.5, calibrate="platt", min_heldout=5, min_heldout_yes=2, min_auc=0.6)
    rel = reliability(q, y, z, part, 4, train_labels, train_yes, rules)
    sel, rep = part == SELECT, part == REPORT
    a, b = platt(z[sel], y[sel])
    assert rel.calibration == {"method": "platt", "a": a, "b": b}
    assert rel.keep.tolist() == [True, False, True, False]
    assert [f["dropped"] for f in rel.fields] == [None, "select AUC below min_auc", None, "one answer in training"]
    s_auc = auc(q[sel], y[sel], z[sel], 4)
    assert [f["select_auc"] for f in rel.fields] == [round(float(v), 4) for v in s_auc]
    assert s_auc[1] < 0.6 <= s_auc[0]
    # each question's figures: the report part only, calibrated, at the threshold
    pred = sigmoid(a * z + b) > 0.5
    for i, f in enumerate(rel.fields):
        r = rep & (q == i)
        tp, fp, yes = int((pred & r & (y == 1)).sum()), int((pred & r & (y == 0)).sum()), int((r & (y == 1)).sum())
        assert (f["n_heldout"], f["heldout_yes"], f["heldout_said_yes"]) == (int(r.sum()), yes, tp + fp)
        assert f["precision"] == round(tp / (tp + fp), 4) and f["recall"] == round(tp / yes, 4)
        assert f["base_rate"] == round(yes / int(r.sum()), 4)
    rep_kept = rep & rel.keep[q]
    c = rel.report["calibration"]
    assert c["ece_before"] == ece(sigmoid(z[rep_kept]), y[rep_kept]) and c["ece_after"] == ece(sigmoid(a * z[rep_kept] + b), y[rep_kept])
    assert c["ece_after"] < c["ece_before"]  # the raw logits are over-confident
    assert (c["select_pairs"], c["report_pairs"]) == (int(sel.sum()), int(rep_kept.sum()))
    qs = rel.report["questions"]
    assert (qs["total"], qs["kept"], qs["dropped_one_class"], qs["dropped_low_auc"], qs["drop_overruled"]) == (4, 2, 1, 1, False)
    fid = rel.report["fidelity"]
    assert fid["questions_measured_before"] == 4 and fid["questions_measured_after"] == 2
    assert fid["macro_f1_per_question_after_drop"] > fid["macro_f1_per_question_before_drop"]


def test_too_few_labels_leave_the_figures_null_and_nothing_judged():
    q = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    y = np.array([1, 0, 0, 0, 0, 0, 1, 1])
    z = np.array([2.0, -1, -1, -1, -1, 1, 2, 2])
    part = np.full(8, REPORT)
    rel = reliability(q, y, z, part, 2, np.array([10, 10]), np.array([5, 5]), Rules(calibrate="none", min_heldout=5, min_heldout_yes=2))
    assert rel.calibration == {"method": "none", "a": 1.0, "b": 0.0}
    assert rel.keep.tolist() == [True, True]  # nothing in the select part: no question judged
    assert [(f["precision"], f["recall"], f["n_heldout"], f["heldout_yes"]) for f in rel.fields] == [(None, None, 6, 1), (None, None, 2, 2)]
    assert rel.fields[0]["base_rate"] == round(1 / 6, 4)
    assert rel.report["questions"]["with_precision"] == 0


def test_a_rule_that_would_drop_every_question_drops_none():
    q, y = np.array([0, 1]), np.array([1, 1])
    rel = reliability(q, y, np.array([1.0, 1.0]), np.array([SELECT, REPORT]), 2, np.array([3, 3]), np.array([3, 0]), Rules())
    assert rel.keep.tolist() == [True, True] and rel.report["questions"]["drop_overruled"] is True
    assert [f["dropped"] for f in rel.fields] == [None, None]


def test_min_kept_keeps_the_dropped_questions_with_the_highest_select_auc():
    """Six questions: q1, q2 and q4 have heads that say nothing (select AUC below 0.6), q5 one answer in training.
    min_kept brings back the low-AUC ones, highest select AUC first, before the one-class one; never more than m."""
    rng = np.random.default_rng(3)
    q, y, z, part = held_out(rng, m=6, per_q=80)
    z[q == 2] = rng.normal(0, 2, 80)
    z[q == 4] = np.where(y[q == 4] == 1, -1.0, 1.0) + rng.normal(0, 1, 80)  # q4: reversed
    train_labels, train_yes = np.full(6, 40), np.array([10, 12, 9, 11, 14, 40])
    base = Rules(threshold=0.5, calibrate="platt", min_heldout=5, min_heldout_yes=2, min_auc=0.6)
    sel = part == SELECT
    s_auc = auc(q[sel], y[sel], z[sel], 6)
    low = sorted([1, 2, 4], key=lambda i: -s_auc[i])
    assert all(s_auc[i] < 0.6 for i in low) and s_auc[0] >= 0.6 and s_auc[3] >= 0.6
    kept = lambda n: reliability(q, y, z, part, 6, train_labels, train_yes, Rules(**{**base.__dict__, "min_kept": n}))  # noqa: E731
    assert kept(0).keep.tolist() == [True, False, False, True, False, False]
    assert kept(2).keep.tolist() == kept(0).keep.tolist()  # two kept already: nothing comes back
    three = kept(3)
    assert np.flatnonzero(three.keep).tolist() == sorted([0, 3, low[0]])
    assert three.report["questions"]["kept_for_min_kept"] == 1 and three.report["questions"]["kept"] == 3
    assert three.report["questions"]["dropped_low_auc"] == 2 and three.report["questions"]["dropped_one_class"] == 1
    assert [f["dropped"] is None for f in three.fields] == three.keep.tolist()
    assert three.report["rules"]["min_kept"] == 3
    assert three.kept_back == {low[0]: "select AUC below min_auc"} and kept(0).kept_back == {}
    assert kept(6).kept_back == {1: "select AUC below min_auc", 2: "select AUC below min_auc", 4: "select AUC below min_auc",
                                 5: "one answer in training"}
    assert np.flatnonzero(kept(5).keep).tolist() == [0, 1, 2, 3, 4]  # every low-AUC one before the one-class q5
    assert kept(9).keep.all() and kept(9).report["questions"]["kept_for_min_kept"] == 4
    assert ("reliability: 3 of 6 questions kept (1 dropped with one answer in training, 2 dropped below min_auc on the select "
            "part, 1 that the rule drops kept to reach min_kept 3); ") in format_reliability(three.report)
    assert "(0 dropped with one answer in training, 0 dropped below min_auc on the select part, 4 that the rule drops kept to " \
           "reach min_kept 9)" in format_reliability(kept(9).report)  # all kept: it read "(0 ..., 0 ..., 4 more kept for min_kept)"
    assert "min_kept" not in format_reliability(kept(0).report)
