"""The question-answering report of the paper's Table 6: the heads' answers on held-out pairs against the LLM's.

``classification_report`` is scikit-learn's with ``target_names=["no", "yes"]``, ``output_dict=True`` and
``zero_division=0`` ("no", "yes", "macro avg", "weighted avg" with precision / recall / f1-score / support, and
"accuracy"), supports as integers; ``format_report`` renders it as Markdown.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import classification_report as sklearn_classification_report

from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.pairs import LabelPairs


def classification_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    """Precision, recall, F1 and support for no (0) and yes (1), macro and weighted averages, accuracy."""
    y_true = np.asarray(y_true).astype(np.int64).ravel()
    y_pred = np.asarray(y_pred).astype(np.int64).ravel()
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true and y_pred differ in length ({len(y_true)} vs {len(y_pred)})")
    if not (np.isin(y_true, (0, 1)).all() and np.isin(y_pred, (0, 1)).all()):
        raise ValueError("labels must be 0 (no) or 1 (yes)")
    report = sklearn_classification_report(y_true, y_pred, labels=[0, 1], target_names=["no", "yes"], output_dict=True,
                                           zero_division=0)
    for row in report.values():
        if isinstance(row, dict):
            row["support"] = int(row["support"])
    return report


@torch.no_grad()
def predict_pairs(heads: StackedHeads, embeddings: np.ndarray, doc: np.ndarray, question: np.ndarray, chunk: int = 4096,
                  logits: bool = False) -> np.ndarray:
    """P(yes) = sigma(C_q(e_doc)) for each (doc, question) pair, float32 (``logits``: C_q(e_doc) itself)."""
    out = np.empty(len(doc), dtype=np.float32)
    device = heads.w1.device
    for i in range(0, len(doc), chunk):
        x = torch.as_tensor(np.asarray(embeddings[doc[i : i + chunk]]), device=device).to(heads.w1.dtype)
        q = torch.as_tensor(np.asarray(question[i : i + chunk], dtype=np.int64), device=device)
        z = heads.forward_pairs(x, q)
        out[i : i + chunk] = (z if logits else torch.sigmoid(z)).float().cpu().numpy()
    return out


def evaluate_heads(heads: StackedHeads, embeddings: np.ndarray, pairs: LabelPairs, tau: float = 0.5) -> dict:
    """The paper's Table 6 on these pairs: y_hat = 1[sigma(C_q(e)) > tau] against the LLM's answers."""
    probs = predict_pairs(heads, embeddings, pairs.doc, pairs.question)
    report = classification_report(pairs.answer, (probs > tau).astype(np.int8))
    report["tau"] = tau
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
