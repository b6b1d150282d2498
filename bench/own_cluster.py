"""What each own-cluster rule keeps, on a finished questions stage's probes (no LLM: the probe counts are in
``questions/candidates.parquet``).

    python bench/own_cluster.py runs/reference                 # the rules below side by side
    python bench/own_cluster.py runs/reference --t 5 --json out.json

A rule is (``cqg.own_cluster_share``, ``cqg.own_cluster_quality``): a probed candidate that no text filter dropped is
kept if its own cluster's positive probes say yes for more than the share, and (with a floor) its Eq. 1 quality is
above the floor. Per rule: the candidates kept, per generation prompt, their Eq. 1 median, the clusters left with
none, and the questions top-t would take (at most t a cluster) before dedup and the opening filter, whose costs are
the run's own (printed from its manifest). The rule "0.5, none" is the document rule the stage shipped with; the
sentence rules lower the bar and ask instead that a question be more often yes in its cluster than outside it.
Last line: ``own_cluster_sentence_vs_document_top_t: X``, top-t's questions under (1/6, 0) over those under (0.5, none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RULES = [(0.5, None), (1 / 3, None), (1 / 3, 0.0), (1 / 6, None), (1 / 6, 0.0), (0.0, 0.0)]
SENTENCE, DOCUMENT = (1 / 6, 0.0), (0.5, None)


def rule_name(share: float, floor: float | None) -> str:
    return f"yes > {share:.2f} of own positives" + ("" if floor is None else f", Eq. 1 > {floor:g}")


def keeps(cand: dict, rules, t: int, prompts: int) -> list[dict]:
    """Per rule, what it keeps of the candidates (columns of candidates.parquet as numpy arrays)."""
    from cqg_ray.cqg.select import own_cluster_no

    text_ok = np.isin(cand["filtered"], ["", "own_cluster", "opening"])  # the text filters' drops stay dropped
    probed = ~np.isnan(cand["quality"])
    clusters = np.unique(cand["cluster"])
    out = []
    for share, floor in rules:
        ok = text_ok & probed & ~own_cluster_no(cand["positive_yes"], cand["positive_n"], share, cand["quality"], floor)
        per_cluster = np.array([int(ok[cand["cluster"] == c].sum()) for c in clusters])
        q = cand["quality"][ok]
        out.append({"rule": rule_name(share, floor), "share": share, "floor": floor, "kept": int(ok.sum()),
                    "per_prompt": round(float(ok.sum()) / prompts, 2) if prompts else None,
                    "quality_median": round(float(np.median(q)), 3) if len(q) else None,
                    "clusters_without": int((per_cluster == 0).sum()), "top_t": int(np.minimum(per_cluster, t).sum())})
    return out


def main() -> None:
    import pyarrow.parquet as pq

    from cqg_ray.rundir import RunDir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--t", type=int, help="top t a cluster (default: the run's cqg.t)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    run = RunDir(a.run_dir)
    path = run.path("questions", "candidates.parquet")
    if not run.exists("questions", "candidates.parquet"):
        raise SystemExit(f"{path}: no finished questions stage in {a.run_dir}")
    table = pq.read_table(path)
    cand = {n: table.column(n).to_numpy(zero_copy_only=False) for n in ("cluster", "quality", "positive_yes", "positive_n", "filtered")}
    cand["quality"] = cand["quality"].astype(np.float64)
    counts = (run.manifest("questions") or {}).get("counts", {})
    cfg = {}
    if run.exists("config.yaml"):
        import yaml

        cfg = (yaml.safe_load(run.read_bytes("config.yaml")) or {}).get("cqg", {})
    t = a.t or int(cfg.get("t", 4))
    prompts = int(counts.get("generation_prompts", 0))
    rows = keeps(cand, RULES, t, prompts)
    print(f"{a.run_dir}: {len(table)} candidates from {prompts} prompts; top t = {t}; the run dropped "
          f"{counts.get('deduped', '?')} at dedup and {counts.get('dropped_opening', '?')} at the opening filter of "
          f"{counts.get('selected_top_t', '?')} chosen")
    print(f"{'rule':<45} {'kept':>6} {'a prompt':>9} {'Eq.1 med':>9} {'no question':>12} {'top t':>6}")
    for r in rows:
        print(f"{r['rule']:<45} {r['kept']:>6} {r['per_prompt'] if r['per_prompt'] is not None else '-':>9} "
              f"{r['quality_median'] if r['quality_median'] is not None else '-':>9} {r['clusters_without']:>12} {r['top_t']:>6}")
    if a.json:
        Path(a.json).write_text(json.dumps({"t": t, "prompts": prompts, "rules": rows}, indent=1))
    by = {(r["share"], r["floor"]): r for r in rows}
    doc, sent = by[DOCUMENT]["top_t"], by[SENTENCE]["top_t"]
    print(f"own_cluster_sentence_vs_document_top_t: {sent / doc if doc else float('inf'):.4f}")


if __name__ == "__main__":
    main()
