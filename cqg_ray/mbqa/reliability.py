"""Each question's measured reliability: calibration, the drop rule and per-question figures on held-out labels.

The held-out labelled texts are split once, before anything is chosen (`split_heldout`): the *select* part fits the
calibration and decides which questions leave the model; the *report* part, used for nothing else, gives the figures
that are stored and shown. Every figure is agreement with the labelling LLM on texts the heads never trained on.

    rel = reliability(held, m, train_labels, train_yes, cfg)      # held: the held-out pairs (question, answer, logit, part)
    rel.keep, rel.calibration, rel.fields (per question), rel.report

Calibration is one Platt scaling shared by every head, ``sigma(a * logit + b)`` fitted on the select part's pairs
(``platt``); it folds into the heads' last layer (`StackedHeads.calibrated`), so the model format does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SELECT, REPORT = 1, 2  # the parts of a held-out text (0: trained on)


def split_heldout(n_held: int, select_share: float, seed: int = 0) -> np.ndarray:
    """Which of ``n_held`` held-out texts (in their sorted order) calibrate and select (True) and which only report
    (False): round(select_share * n_held) of them, by a seeded permutation of their own."""
    n_select = int(round(select_share * n_held))
    if 0 < select_share < 1 and n_held > 1:
        n_select = min(max(n_select, 1), n_held - 1)
    rng = np.random.default_rng([seed, 0x53454C])  # "SEL": independent of the hold-out draw
    out = np.zeros(n_held, dtype=bool)
    out[rng.permutation(n_held)[:n_select]] = True
    return out


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def platt(logit: np.ndarray, answer: np.ndarray) -> tuple[float, float]:
    """(a, b) of sigma(a * logit + b) fitted to the 0/1 answers by logistic regression (barely regularised).
    (1, 0), no change, when the answers hold one class only or a is not positive (it would reverse the heads)."""
    from sklearn.linear_model import LogisticRegression

    answer = np.asarray(answer).astype(np.int64)
    if len(answer) == 0 or answer.min() == answer.max():
        return 1.0, 0.0
    lr = LogisticRegression(C=1e4, max_iter=1000).fit(np.asarray(logit, dtype=np.float64).reshape(-1, 1), answer)
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    return (a, b) if a > 0 else (1.0, 0.0)


def ece(prob: np.ndarray, answer: np.ndarray, bins: int = 10) -> float | None:
    """Expected calibration error: over ``bins`` equal-width bins of P(yes), the pair-weighted mean of
    |mean P(yes) - yes rate|. None for no pairs."""
    prob, answer = np.asarray(prob, dtype=np.float64), np.asarray(answer, dtype=np.float64)
    if len(prob) == 0:
        return None
    b = np.minimum((prob * bins).astype(np.int64), bins - 1)
    n = np.bincount(b, minlength=bins)
    gap = np.abs(np.bincount(b, weights=prob, minlength=bins) - np.bincount(b, weights=answer, minlength=bins))
    return float(gap.sum() / n.sum())


def counts(question: np.ndarray, answer: np.ndarray, pred: np.ndarray, m: int) -> dict:
    """Per question (m,): labels ``n``, LLM yes ``yes``, and the heads' ``tp``, ``fp``, ``fn`` against them."""
    q, y, p = np.asarray(question, np.int64), np.asarray(answer, bool), np.asarray(pred, bool)
    c = lambda mask: np.bincount(q[mask], minlength=m).astype(np.int64)  # noqa: E731
    return {"n": c(np.ones(len(q), bool)), "yes": c(y), "tp": c(y & p), "fp": c(~y & p), "fn": c(y & ~p)}


def auc(question: np.ndarray, answer: np.ndarray, score: np.ndarray, m: int) -> np.ndarray:
    """Per question (m,): ROC AUC of ``score`` against the answers (ties count half); NaN where one class is missing."""
    from scipy.stats import rankdata

    q, y, s = np.asarray(question, np.int64), np.asarray(answer, bool), np.asarray(score, np.float64)
    out = np.full(m, np.nan)
    order = np.argsort(q, kind="stable")
    starts = np.searchsorted(q[order], np.arange(m + 1))
    for i in range(m):
        idx = order[starts[i]:starts[i + 1]]
        n_pos = int(y[idx].sum())
        n_neg = len(idx) - n_pos
        if n_pos and n_neg:  # Mann-Whitney: the positives' mean rank (ties averaged)
            ranks = rankdata(s[idx])
            out[i] = float((ranks[y[idx]].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return out


def macro_f1(c: dict, rows: np.ndarray) -> float | None:
    """Macro-F1 (mean of the yes and no classes' F1) per question, averaged over the questions ``rows`` (bool (m,))."""
    tp, fp, fn = c["tp"], c["fp"], c["fn"]
    tn = c["n"] - tp - fp - fn
    f1 = lambda t, f_p, f_n: np.where(2 * t + f_p + f_n > 0, 2 * t / np.maximum(2 * t + f_p + f_n, 1), 1.0)  # noqa: E731
    per_q = (f1(tp, fp, fn) + f1(tn, fn, fp)) / 2
    return float(per_q[rows].mean()) if rows.any() else None


@dataclass
class Rules:
    """The rule behind every shown figure and every drop (`TrainConfig`'s fields of the same names)."""

    threshold: float = 0.5  # a question counts as answered yes when its calibrated P(yes) > threshold
    calibrate: str = "platt"  # "platt" (shared) or "none"
    min_heldout: int = 5  # a figure needs this many held-out labels of the question ...
    min_heldout_yes: int = 2  # ... and this many of them yes (precision and recall; otherwise null)
    min_auc: float | None = 0.6  # drop a question whose select-part AUC is below this (where it has min_heldout_yes of each class)
    min_kept: int = 0  # never fewer questions kept than this (or all m): the dropped ones with the highest select AUC stay


@dataclass
class Reliability:
    keep: np.ndarray  # (m,) bool: the questions that stay in the model
    calibration: dict  # {"method", "a", "b"}: P(yes) = sigma(a * logit + b)
    fields: list[dict]  # per question (all m): precision, recall, base_rate, n_heldout, heldout_yes, select_auc, dropped
    report: dict = field(default_factory=dict)
    kept_back: dict[int, str] = field(default_factory=dict)  # question -> the rule's reason, for those kept for min_kept


def reliability(question: np.ndarray, answer: np.ndarray, logit: np.ndarray, part: np.ndarray, m: int,
                train_labels: np.ndarray, train_yes: np.ndarray, rules: Rules) -> Reliability:
    """The held-out pairs (question, 0/1 answer, the uncalibrated head logit, part SELECT or REPORT) -> calibration
    (fitted on SELECT), the questions kept (rules applied on SELECT and on the training counts) and each question's
    figures on REPORT at ``rules.threshold`` after calibration."""
    question, answer = np.asarray(question, np.int64), np.asarray(answer, np.int64)
    logit, part = np.asarray(logit, np.float64), np.asarray(part)
    sel, rep = part == SELECT, part == REPORT
    a, b = platt(logit[sel], answer[sel]) if rules.calibrate == "platt" else (1.0, 0.0)
    prob_raw, prob = sigmoid(logit), sigmoid(a * logit + b)

    # the drop rule, on the select part and the training counts only
    train_labels, train_yes = np.asarray(train_labels, np.int64), np.asarray(train_yes, np.int64)
    one_class = (train_yes == 0) | (train_yes == train_labels)
    s_counts = counts(question[sel], answer[sel], prob[sel] > rules.threshold, m)
    s_auc = auc(question[sel], answer[sel], logit[sel], m)
    judged = (s_counts["yes"] >= rules.min_heldout_yes) & (s_counts["n"] - s_counts["yes"] >= rules.min_heldout_yes)
    low_auc = judged & (s_auc < rules.min_auc) if rules.min_auc is not None else np.zeros(m, bool)
    drop = one_class | low_auc
    kept_all = False
    if drop.all():
        drop[:] = False
        kept_all = True
    def rule_reason(i: int) -> str:  # why the rule drops question i
        return "one answer in training" if one_class[i] else "select AUC below min_auc"

    kept_back = np.zeros(m, bool)  # dropped by the rule, kept for min_kept
    short = min(rules.min_kept, m) - int((~drop).sum())
    if short > 0:  # low AUC before one answer in training, then the highest select AUC first (unjudged: as 0.5)
        ranked = sorted(np.flatnonzero(drop), key=lambda i: (bool(one_class[i]), -(0.5 if np.isnan(s_auc[i]) else s_auc[i]), i))
        kept_back[ranked[:short]] = True
        drop &= ~kept_back

    # the figures, on the report part only
    r = counts(question[rep], answer[rep], prob[rep] > rules.threshold, m)
    enough = (r["n"] >= rules.min_heldout) & (r["yes"] >= rules.min_heldout_yes)
    fields = []
    for i in range(m):
        said_yes = r["tp"][i] + r["fp"][i]
        fields.append({
            "precision": round(float(r["tp"][i] / said_yes), 4) if enough[i] and said_yes else None,
            "recall": round(float(r["tp"][i] / r["yes"][i]), 4) if enough[i] else None,
            "base_rate": round(float(r["yes"][i] / r["n"][i]), 4) if r["n"][i] else None,
            "n_heldout": int(r["n"][i]), "heldout_yes": int(r["yes"][i]), "heldout_said_yes": int(said_yes),
            "select_auc": None if np.isnan(s_auc[i]) else round(float(s_auc[i]), 4),
            "dropped": rule_reason(i) if drop[i] else None,
        })
    keep = ~drop
    rep_kept = rep & keep[question]
    report = {
        "rules": {"threshold": rules.threshold, "calibrate": rules.calibrate, "min_heldout": rules.min_heldout,
                  "min_heldout_yes": rules.min_heldout_yes, "min_auc": rules.min_auc, "min_kept": rules.min_kept,
                  "figure": "precision and recall on the report part at P(yes) > threshold, shown where the question has "
                            "min_heldout report labels with min_heldout_yes of them yes (precision also needs a yes from the head)",
                  "drop": "a question leaves the model when its training labels hold one answer only, or its select-part AUC "
                          "is below min_auc where the select part has min_heldout_yes yes and as many no, unless that "
                          "would keep fewer than min_kept: then the ones with the highest select AUC stay"},
        "calibration": {"method": rules.calibrate, "a": a, "b": b,
                        "ece_before": ece(prob_raw[rep_kept], answer[rep_kept]), "ece_after": ece(prob[rep_kept], answer[rep_kept]),
                        "select_pairs": int(sel.sum()), "report_pairs": int(rep_kept.sum())},
        "questions": {"total": m, "kept": int(keep.sum()), "dropped_one_class": int((one_class & drop).sum()),
                      "dropped_low_auc": int((low_auc & ~one_class & drop).sum()), "drop_overruled": kept_all,
                      "kept_for_min_kept": int(kept_back.sum()),
                      "with_precision": int(sum(f["precision"] is not None for f in fields)),
                      "with_precision_kept": int(sum(f["precision"] is not None for f, k in zip(fields, keep) if k))},
        "heldout_per_question": {"select_median": float(np.median(s_counts["n"])), "report_median": float(np.median(r["n"])),
                                 "report_min": int(r["n"].min()) if m else 0},
        "fidelity": {"macro_f1_per_question_before_drop": macro_f1(r, enough),
                     "macro_f1_per_question_after_drop": macro_f1(r, enough & keep),
                     "questions_measured_before": int(enough.sum()), "questions_measured_after": int((enough & keep).sum()),
                     "yes_base_rate_before": _rate(r, np.ones(m, bool)), "yes_base_rate_after": _rate(r, keep)},
    }
    return Reliability(keep, {"method": rules.calibrate, "a": a, "b": b}, fields, report,
                       {int(i): rule_reason(i) for i in np.flatnonzero(kept_back)})


def _rate(c: dict, rows: np.ndarray) -> float | None:
    n = int(c["n"][rows].sum())
    return round(float(c["yes"][rows].sum() / n), 4) if n else None


def format_reliability(report: dict) -> str:
    """A few lines for people: the calibration, what was dropped, fidelity before and after."""
    c, q, f = report["calibration"], report["questions"], report["fidelity"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    n, min_kept = q.get("kept_for_min_kept"), report.get("rules", {}).get("min_kept")
    back = f", {n} that the rule drops kept to reach min_kept {min_kept}" if n else ""
    return "\n".join([
        f"reliability: calibration {c['method']} (a={c['a']:.3f}, b={c['b']:.3f}); expected calibration error on the report part "
        f"{fmt(c['ece_before'])} -> {fmt(c['ece_after'])} ({c['report_pairs']} pairs)",
        f"reliability: {q['kept']} of {q['total']} questions kept ({q['dropped_one_class']} dropped with one answer in training, "
        f"{q['dropped_low_auc']} dropped below min_auc on the select part{back}); {q['with_precision_kept']} kept ones have a "
        "measured precision",
        f"reliability: macro-F1 per question on the report part {fmt(f['macro_f1_per_question_before_drop'])} before the drop "
        f"({f['questions_measured_before']} questions), {fmt(f['macro_f1_per_question_after_drop'])} after "
        f"({f['questions_measured_after']}); yes base rate {fmt(f['yes_base_rate_before'])} -> {fmt(f['yes_base_rate_after'])}",
    ])
