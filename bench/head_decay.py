"""The heads' weight decay (``train.weight_decay``) side by side on a finished run's labels (no LLM).

    python bench/head_decay.py runs/reference                       # weight decay 0 (the paper), 0.01, 0.03, 0.1
    python bench/head_decay.py runs/reference --wd 0 0.03 --json out.json

Per value, the train stage runs on a scratch copy of the run directory (`cqg-ray run --until train --set
train.weight_decay=X`: the same split, calibration and drops as a build), and then on the report part of the held-out
texts (never trained on, never used to choose) each kept head's AUC against the labeller's answers, averaged over the
questions every value kept (so the drops do not move the average), beside the stage's own figures: questions kept,
those with a measured precision, macro-F1 per question at the model's tau. The last line is
``head_decay_report_auc_gain: X``, the mean report-part AUC at the largest value over that at 0.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = ("prepare", "encode", "cluster", "questions", "labels", "llm", "config.yaml")


def report_aucs(run_dir: str, model_dir: str) -> dict[int, float]:
    """{question id: AUC of its head on the report part's labels} for the model's questions with both answers there."""
    import pyarrow.parquet as pq
    import torch
    from sklearn.metrics import roc_auc_score

    from cqg_ray.artifacts import embedding_files
    from cqg_ray.config import load_config
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.stage import heldout_ids, labelled_doc_ids
    from cqg_ray.rundir import RunDir

    run = RunDir(run_dir)
    _, report = heldout_ids(labelled_doc_ids(run), load_config(str(Path(run_dir) / "config.yaml")).train)  # the stage's own split
    labels = pq.read_table(Path(run_dir) / "labels" / "labels.parquet", columns=["doc_id", "question_id", "answer"]).to_pandas()
    labels = labels[labels.doc_id.isin(report)]
    emb = {}
    for f in embedding_files(run):
        t = pq.read_table(f)
        docs = np.array(t.column("doc_id").to_pylist())
        keep = np.isin(docs, labels.doc_id.unique())
        if keep.any():
            emb.update(zip(docs[keep], np.stack(t.column("embedding").to_numpy(zero_copy_only=False))[keep]))
    model = InterpretableEmbedder.load(model_dir, device="cpu", load_encoder=False)  # heads only: the embeddings are stored
    x = np.stack([emb[d] for d in labels.doc_id]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    with torch.no_grad():
        logits = model.heads.forward_all(torch.from_numpy(x)).numpy()
    out = {}
    for j, rec in enumerate(model.question_records):
        rows = (labels.question_id == int(rec["id"])).to_numpy()
        y = labels.answer.to_numpy()[rows]
        if rows.any() and 0 < y.sum() < len(y):
            out[int(rec["id"])] = float(roc_auc_score(y, logits[rows, j]))
    return out


def train_on_copy(run_dir: str, copy: Path, config: str | None, sets: list[str], what: str) -> float:
    """Copy the run's finished stages (`STAGES`) to ``copy`` and run the train stage there (`cqg-ray run --until train`,
    the run's config or ``config``, each of ``sets`` as --set KEY=VALUE); its seconds. Exits with the stage's error."""
    for name in STAGES:
        src = Path(run_dir) / name
        if src.is_dir():
            shutil.copytree(src, copy / name)
        elif src.exists():
            copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, copy / name)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "cqg_ray.cli", "run", "--config", config or str(copy / "config.yaml"), "-r", str(copy),
           "--until", "train", *[x for kv in sets for x in ("--set", kv)]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"train with {what} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run directory whose labels stage is done (e.g. runs/reference)")
    ap.add_argument("--wd", type=float, nargs="+", default=[0.0, 0.01, 0.03, 0.1], help="train.weight_decay values")
    ap.add_argument("--config", default=None, help="the config to train with (default: the run's config.yaml)")
    ap.add_argument("--json", default=None, help="write the rows here too")
    a = ap.parse_args()
    values = sorted(set(a.wd) | {0.0})
    rows, aucs = [], {}
    with tempfile.TemporaryDirectory(prefix="head-decay-") as scratch:
        for wd in values:
            copy = Path(scratch) / f"wd{wd:g}"
            wall = train_on_copy(a.run_dir, copy, a.config, [f"train.weight_decay={wd}"], f"weight_decay {wd}")
            rel = json.loads((copy / "model" / "eval_report.json").read_text())["reliability"]
            aucs[wd] = report_aucs(str(copy), str(copy / "model"))
            questions = json.loads((copy / "model" / "questions.json").read_text())
            rows.append({"weight_decay": wd, "kept": len(questions), "with_precision": sum(q.get("precision") is not None for q in questions),
                         "macro_f1_at_tau": round(rel["fidelity"]["macro_f1_per_question_before_drop"], 3), "seconds": round(wall, 1)})
            print(f"weight decay {wd:g}: trained in {wall:.0f} s", flush=True)
    common = set.intersection(*(set(v) for v in aucs.values()))
    for r in rows:
        r["report_auc"] = round(float(np.mean([aucs[r["weight_decay"]][q] for q in sorted(common)])), 4)
    print(f"\n{len(common)} questions kept by every value; report part of {a.run_dir}\n")
    print("| weight decay | questions kept | with a precision | macro-F1 per question at tau | mean report AUC (common) | train s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['weight_decay']:g} | {r['kept']} | {r['with_precision']} | {r['macro_f1_at_tau']:.3f} | {r['report_auc']:.4f} | {r['seconds']:.0f} |")
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (this process; each training ran in its own)")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "common_questions": len(common)}, indent=1))
    print(f"head_decay_report_auc_gain: {rows[-1]['report_auc'] / rows[0]['report_auc']:.3f}")


if __name__ == "__main__":
    main()
