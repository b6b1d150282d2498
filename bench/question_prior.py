"""The question prior (``train.question_prior``) side by side on a finished run's labels (no LLM).

    python bench/question_prior.py runs/reference
    python bench/question_prior.py runs/reference --json out.json
    python bench/question_prior.py runs/demo --set train.weight_decay=0.03     # more overrides, for both

Twice, the train stage runs on a scratch copy of the run directory (`cqg-ray run --until train`, the run's config with
``train.question_prior`` false, then true: the same split, calibration and drops as a build). Each model is measured
against the labeller and against a person:

- the report part of the held-out texts (never trained on, never used to choose): each kept head's AUC against the
  labeller's answers, averaged over the questions both kept (`head_decay.report_aucs`);
- the hand-answered pairs in ``bench/data/hand_pairs_*.jsonl`` whose question both models kept (STS-B sentences and
  SciFact abstracts, answered by hand in earlier sessions for the reference model's questions): the AUC of the
  model's P(yes) against the person's answer, pooled over the pairs.

The last line is ``question_prior_hand_auc_gain: X``, the hand AUC with the prior over that without (a run whose
questions no hand-answered pair asks: ``question_prior_report_auc_gain``, the report part's).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from head_decay import report_aucs, train_on_copy  # noqa: E402


def hand_pairs(questions: set[str]) -> list[tuple[str, str, bool]]:
    """(text, question, answer) of every hand-answered pair in bench/data whose question is in ``questions``, once each."""
    seen: dict[tuple[str, str], bool] = {}
    for f in sorted((ROOT / "bench" / "data").glob("hand_pairs_*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["question"] in questions:
                seen.setdefault((r["text"], r["question"]), bool(r["answer"]))
    return [(t, q, a) for (t, q), a in seen.items()]


def hand_auc(model_dir: str, pairs: list[tuple[str, str, bool]]) -> float:
    from sklearn.metrics import roc_auc_score

    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    model = InterpretableEmbedder.load(model_dir, device="cpu")
    texts = sorted({t for t, _, _ in pairs})
    probs = np.asarray(model.encode(texts, output="probs"))
    row, col = {t: i for i, t in enumerate(texts)}, {q: j for j, q in enumerate(model.questions)}
    return float(roc_auc_score([a for _, _, a in pairs], [probs[row[t], col[q]] for t, q, _ in pairs]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run directory whose labels stage is done (e.g. runs/reference)")
    ap.add_argument("--config", default=None, help="the config to train with (default: the run's config.yaml)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for both trainings (e.g. train.weight_decay=0.03)")
    ap.add_argument("--json", default=None, help="write the rows here too")
    a = ap.parse_args()
    rows, aucs, models = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="question-prior-") as scratch:
        for prior in (False, True):
            copy = Path(scratch) / f"prior-{str(prior).lower()}"
            wall = train_on_copy(a.run_dir, copy, a.config, [f"train.question_prior={str(prior).lower()}", *a.set], f"question_prior {prior}")
            report = json.loads((copy / "model" / "eval_report.json").read_text())
            aucs[prior] = report_aucs(str(copy), str(copy / "model"))
            questions = json.loads((copy / "model" / "questions.json").read_text())
            models[prior] = ({q["text"] for q in questions}, str(copy / "model"))
            rows.append({"question_prior": prior, "kept": len(questions),
                         "with_precision": sum(q.get("precision") is not None for q in questions),
                         "macro_f1_at_tau": round(report["reliability"]["fidelity"]["macro_f1_per_question_before_drop"], 3),
                         "prior": report.get("question_prior"), "seconds": round(wall, 1)})
            print(f"question prior {prior}: trained in {wall:.0f} s", flush=True)
        pairs = hand_pairs(models[False][0] & models[True][0])  # the pairs of the questions both kept
        answers = {p[2] for p in pairs}
        for r in rows:
            r.update(hand_pairs=len(pairs), hand_yes=sum(p[2] for p in pairs),
                     hand_auc=round(hand_auc(models[r["question_prior"]][1], pairs), 4) if len(answers) == 2 else None)
    common = set.intersection(*(set(v) for v in aucs.values()))
    for r in rows:
        r["report_auc"] = round(float(np.mean([aucs[r["question_prior"]][q] for q in sorted(common)])), 4)
    print(f"\n{len(common)} questions kept by both; report part of {a.run_dir}; hand pairs from bench/data/hand_pairs_*.jsonl\n")
    print("| question prior | questions kept | with a precision | macro-F1 per question at tau | mean report AUC (common) | "
          "hand pairs (yes) | hand AUC | train s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {'on' if r['question_prior'] else 'off'} | {r['kept']} | {r['with_precision']} | {r['macro_f1_at_tau']:.3f} | "
              f"{r['report_auc']:.4f} | {r['hand_pairs']} ({r['hand_yes']}) | {'-' if r['hand_auc'] is None else format(r['hand_auc'], '.4f')} | "
              f"{r['seconds']:.0f} |")
    if rows[1]["prior"]:
        print(f"\nprior: P(yes) = sigma({rows[1]['prior']['alpha']:.3f} * cos(text, question) {rows[1]['prior']['beta']:+.3f})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (this process; each training ran in its own)")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "common_questions": len(common)}, indent=1))
    if rows[0]["hand_auc"] is None:  # no hand-answered pairs of both answers on these questions: the labeller's figure
        print(f"question_prior_report_auc_gain: {rows[1]['report_auc'] / rows[0]['report_auc']:.3f}")
    else:
        print(f"question_prior_hand_auc_gain: {rows[1]['hand_auc'] / rows[0]['hand_auc']:.3f}")


if __name__ == "__main__":
    main()
