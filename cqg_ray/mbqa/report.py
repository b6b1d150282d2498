"""The question-answering report of the paper's Table 6 (numpy only), and its Markdown rendering.

Keys follow scikit-learn's `classification_report(..., target_names=["no", "yes"], output_dict=True)`
("no", "yes", "macro avg", "weighted avg" with precision / recall / f1-score / support, and "accuracy"),
with zero_division = 0.
"""

from __future__ import annotations

import numpy as np


def classification_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    """Precision, recall, F1 and support for no (0) and yes (1), macro and weighted averages, accuracy."""
    y_true = np.asarray(y_true).astype(np.int64).ravel()
    y_pred = np.asarray(y_pred).astype(np.int64).ravel()
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true and y_pred differ in length ({len(y_true)} vs {len(y_pred)})")
    if not (np.isin(y_true, (0, 1)).all() and np.isin(y_pred, (0, 1)).all()):
        raise ValueError("labels must be 0 (no) or 1 (yes)")
    n = len(y_true)
    report: dict = {}
    for cls, name in ((0, "no"), (1, "yes")):
        tp = int(np.sum((y_pred == cls) & (y_true == cls)))
        predicted = int(np.sum(y_pred == cls))
        support = int(np.sum(y_true == cls))
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        report[name] = {"precision": precision, "recall": recall, "f1-score": f1, "support": support}
    report["accuracy"] = float(np.mean(y_true == y_pred)) if n else 0.0
    for avg in ("macro avg", "weighted avg"):
        weights = [1.0, 1.0] if avg == "macro avg" else [report["no"]["support"], report["yes"]["support"]]
        total = sum(weights)
        report[avg] = {k: (sum(w * report[c][k] for w, c in zip(weights, ("no", "yes"))) / total if total else 0.0)
                       for k in ("precision", "recall", "f1-score")}
        report[avg]["support"] = n
    return report


TABLE6_ROWS = (("no", "No"), ("yes", "Yes"), ("macro avg", "Macro Avg"), ("weighted avg", "Weighted Avg"))


def is_table6(report: dict) -> bool:
    """Whether `format_report` can render this report (every row and the accuracy are there)."""
    return all(key in report for key, _ in TABLE6_ROWS) and "accuracy" in report


def format_report(report: dict, title: str = "Question answering on held-out documents") -> str:
    """Markdown table in the layout of the paper's Table 6."""
    lines = [f"**{title}**", "", "| Class | Precision | Recall | F1-score | Support |", "|---|---:|---:|---:|---:|"]
    for key, label in TABLE6_ROWS:
        r = report[key]
        lines.append(f"| {label} | {r['precision']:.2f} | {r['recall']:.2f} | {r['f1-score']:.2f} | {r['support']:,} |")
    lines.append(f"| Accuracy | {report['accuracy']:.2f} | | | |")
    return "\n".join(lines)
