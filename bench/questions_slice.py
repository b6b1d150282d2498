"""Question options on a slice: each option builds a small model end to end and is measured by the question-quality
report, faithfulness and STS, side by side on the same clusters.

    python bench/questions_slice.py                              # every option (resumable: run dirs under runs/slice/)
    python bench/questions_slice.py --options paper-0.5b property-1.5b --clusters 20 --faith-n 100

The slice is the demo config (3,000 corpus texts, 30 clusters, the bundled 0.5B answering probes and labels) with
questions written for ``--clusters`` clusters; prepare/encode/cluster run once (runs/slice/base) and are copied into
each option's run directory. Per option: ``cqg-ray run`` (questions, labels, heads, STS-B), then
``cqg-ray questions RUN --quality`` against the full training corpus, then ``cqg-ray evaluate RUN/model --tasks
faithfulness`` on STS-B test (``--faith-n`` texts, the bundled 1.5B judge). Printed: one row per option with the
copy rate, words per question (median / max), cut-off share, top opening share, kept questions per prompt, the
questions stage's counts of what each filter dropped, Eq. 1 median of kept and dropped questions, faithfulness yes
precision and balanced accuracy, STS-B Spearman, and the LLM seconds of generation and probing. Last line:
faithfulness_yes_precision_ratio (the best property option's over paper-0.5b's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_line  # noqa: E402

CLI = [sys.executable, "-m", "cqg_ray.cli"]
CORPUS = str(ROOT.parent / "shared" / "data" / "corpus" / "sentences.jsonl.gz")
STSB = str(ROOT.parent / "shared" / "data" / "sts" / "STSBenchmark.test.tsv")
WRITER = "cqg.writer_model=bundled:qwen2.5-coder-1.5b"
Q20 = ["cqg.questions_per_prompt=20", "llm.max_tokens_generate=520"]
ANSWER15 = "llm.llamacpp.model=bundled:qwen2.5-coder-1.5b"
PAPER = ["cqg.prompt=paper", "cqg.filters=[]", "cqg.p_p=5", "cqg.p_h=3", "cqg.p_e=2"]
OPTIONS: dict[str, list[str]] = {
    "paper-0.5b": PAPER,                                                   # what the shipped model was built with
    "paper-1.5b": [*PAPER, WRITER],                                        # only the writer changed
    "property-0.5b": [],                                                   # the property prompt, filters, 20 probes
    "property-1.5b": [WRITER],
    "property-1.5b-noexamples": [WRITER, "cqg.examples=0"],
    "property-1.5b-400chars": [WRITER, "cqg.max_text_chars=400"],
    "property-1.5b-20q": [WRITER, *Q20],                                   # 20 candidates a prompt instead of 10
    "property-1.5b-20q-1.5b": [WRITER, *Q20, ANSWER15],                    # ... and the 1.5B answering probes and labels
    "property-1.5b-kw": [WRITER, "cqg.keywords=10"],                       # the cluster's c-TF-IDF words in the prompt
    "property-1.5b-kw-2p": [WRITER, "cqg.keywords=10", "cqg.prompts_per_cluster=2"],  # two prompts a cluster, other positives
    "property-1.5b-kw-1.5b": [WRITER, "cqg.keywords=10", ANSWER15],        # ... and the 1.5B answering probes and labels
    "property-1.5b-kw6-1.5b": [WRITER, "cqg.keywords=10", ANSWER15, "cqg.questions_per_prompt=6", "llm.max_tokens_generate=160"],
}


def sh(cmd: list[str], log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "CQG_RAY_PROGRESS": "0"})
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")


def llm_seconds(run: Path, stage: str) -> float | None:
    p = run / "llm" / "ledger" / stage / "_stats.json"
    return json.loads(p.read_text())["totals"].get("wall_s") if p.exists() else None


def measure(name: str, sets: list[str], a) -> dict:
    base, run = Path(a.root) / "base", Path(a.root) / name
    common = ["--config", "demo", "--set", f"cqg.max_clusters={a.clusters}"]
    log = Path(a.root) / f"{name}.log"
    if not run.exists():
        shutil.copytree(base, run, ignore=shutil.ignore_patterns("_lease.json", "_run_log*"))
    sh([*CLI, "run", *common, "--run-dir", str(run), *[x for s in sets for x in ("--set", s)]], log)
    q = run / "quality.json"
    if not q.exists():
        out = subprocess.run([*CLI, "questions", str(run), "--quality", "--json", "--corpus", CORPUS], cwd=ROOT, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        q.write_text(out.stdout[out.stdout.index("{"):])
    quality = json.loads(q.read_text())
    sh([*CLI, "evaluate", str(run / "model"), "--tasks", "faithfulness", "--texts", STSB, "--n", str(a.faith_n), "--out",
        str(run / "faithfulness")], log)
    faith = next(iter(json.loads((run / "faithfulness" / "results.json").read_text())["faithfulness"].values()))["STS-B"]
    counts = json.loads((run / "questions" / "_manifest.json").read_text())["counts"] if (run / "questions" / "_manifest.json").exists() else {}
    ev = json.loads((run / "evaluation" / "results.json").read_text())
    sts = next(iter(ev["scores"]["sts"].values())).get("STS-B")
    return {
        "option": name, "questions": quality["questions"], "copy_rate": quality["copy_rate"], "words_median": quality["words_median"],
        "words_max": quality["words_max"], "cut_off": quality["cut_off_share"], "top_opening": quality["top_opening_share"],
        "per_prompt": round(counts.get("questions", 0) / max(counts.get("generation_prompts", 1), 1), 2),
        "dropped": {k[8:]: counts.get(k) for k in ("dropped_copy", "dropped_long", "dropped_cut_off", "dropped_own_cluster")},
        "eq1_kept": counts.get("quality_median_kept"), "eq1_dropped": counts.get("quality_median_dropped"),
        "yes_precision": faith["faithfulness_yes_precision"], "balanced_accuracy": faith["faithfulness_balanced_accuracy"],
        "sts_b": sts, "generate_s": llm_seconds(run, "cqg-generate"), "probe_s": llm_seconds(run, "cqg-probe"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    ap.add_argument("--clusters", type=int, default=20)
    ap.add_argument("--faith-n", type=int, default=100)
    ap.add_argument("--root", default=str(ROOT / "runs" / "slice"))
    a = ap.parse_args()
    print(cpu_line(), flush=True)
    base = Path(a.root) / "base"
    base.parent.mkdir(parents=True, exist_ok=True)
    sh([*CLI, "run", "--config", "demo", "--set", f"cqg.max_clusters={a.clusters}", "--run-dir", str(base), "--until", "cluster"],
       Path(a.root) / "base.log")
    rows = []
    for name in a.options:
        r = measure(name, OPTIONS[name], a)
        rows.append(r)
        print(json.dumps(r), flush=True)
    head = ["option", "questions", "copy_rate", "words_median", "words_max", "cut_off", "top_opening", "per_prompt", "eq1_kept", "eq1_dropped",
            "yes_precision", "balanced_accuracy", "sts_b", "generate_s", "probe_s"]
    print("| " + " | ".join(head) + " | dropped (copy/long/cut_off/own_cluster) |")
    print("|" + "---|" * (len(head) + 1))
    for r in rows:
        print("| " + " | ".join(str(r[h]) for h in head) + " | " + "/".join(str(v) for v in r["dropped"].values()) + " |")
    paper = next((r for r in rows if r["option"] == "paper-0.5b"), None)
    best = max((r for r in rows if r["option"].startswith("property")), key=lambda r: r["yes_precision"] or 0, default=None)
    if paper and best and paper["yes_precision"]:
        print(f"faithfulness_yes_precision_ratio: {best['yes_precision'] / paper['yes_precision']:.2f}")


if __name__ == "__main__":
    main()
