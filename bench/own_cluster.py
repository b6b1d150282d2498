"""What each own-cluster rule keeps, on a finished questions stage's probes (no LLM: the probe counts are in
``questions/candidates.parquet``).

    python bench/own_cluster.py runs/reference                 # the rules below side by side
    python bench/own_cluster.py runs/reference --t 5 --json out.json

A rule is (``cqg.own_cluster_share``, ``cqg.own_cluster_quality``): a probed candidate that no text filter dropped is
kept if its own cluster's positive probes say yes for more than the share, and (with a floor) its Eq. 1 quality is
above the floor. Per rule: the candidates kept, per generation prompt, their Eq. 1 median, the clusters left with
none, and the questions top-t would take (at most t a cluster); then the whole selection as the stage runs it (the
candidates embedded by the run's encoder: top-t, dedup at theta, the opening filter) with what dedup and the opening
filter drop and the questions m left (``--no-select`` skips it). The run's own costs are printed from its manifest.
The rule "0.5, none" is the document rule the stage shipped with; the sentence rules lower the bar and ask instead
that a question be more often yes in its cluster than outside it.
Then ``own_cluster_sentence_vs_document_questions`` (m under (1/6, 0) over m under (0.5, none)); last line:
``own_cluster_sentence_vs_document_top_t: X``, top-t's questions under (1/6, 0) over those under (0.5, none).
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


def keeps(cand: dict, rules, t: int, prompts: int, emb: np.ndarray | None = None, theta: float = 0.8,
          max_opening_share: float = 1.0) -> list[dict]:
    """Per rule, what it keeps of the candidates (columns of candidates.parquet as numpy arrays). With ``emb`` (the
    candidates' question embeddings) and ``cand["text"]``, also the whole selection as the stage runs it: top-t, dedup
    at ``theta`` and the opening filter, and what each of the two drops."""
    from cqg_ray.cqg.quality import opening
    from cqg_ray.cqg.select import own_cluster_no, select

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
        if emb is not None:
            chosen, kept, _, capped = select(cand["cluster"], np.where(ok, cand["quality"], np.nan), emb, t, theta,
                                             [opening(x) for x in cand["text"]], max_opening_share)
            out[-1].update({"chosen": int(len(chosen)), "deduped": int(len(chosen) - len(kept)), "opening": int(capped.sum()),
                            "questions": int(len(kept))})
    return out


def main() -> None:
    import pyarrow.parquet as pq

    from cqg_ray.rundir import RunDir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--t", type=int, help="top t a cluster (default: the run's cqg.t)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--no-select", action="store_true", help="skip the whole selection (top-t, dedup, opening filter), which "
                    "embeds the candidates with the run's encoder (seconds)")
    a = ap.parse_args()
    run = RunDir(a.run_dir)
    path = run.path("questions", "candidates.parquet")
    if not run.exists("questions", "candidates.parquet"):
        raise SystemExit(f"{path}: no finished questions stage in {a.run_dir}")
    table = pq.read_table(path)
    cand = {n: table.column(n).to_numpy(zero_copy_only=False) for n in ("cluster", "quality", "positive_yes", "positive_n", "filtered", "text")}
    cand["quality"] = cand["quality"].astype(np.float64)
    counts = (run.manifest("questions") or {}).get("counts", {})
    whole = {}
    if run.exists("config.yaml"):
        import yaml

        whole = yaml.safe_load(run.read_bytes("config.yaml")) or {}
    from cqg_ray.config import PipelineConfig

    config = PipelineConfig.model_validate(whole)
    t = a.t or config.cqg.t
    prompts = int(counts.get("generation_prompts", 0))
    emb = None
    if not a.no_select:
        from cqg_ray.encoder import load_encoder

        emb = load_encoder(config.encode.model, backend=config.encode.backend).encode(list(cand["text"]), batch_size=128)
    share = config.cqg.max_opening_share if "opening" in config.cqg.filters else 1.0
    rows = keeps(cand, RULES, t, prompts, emb, config.cqg.theta_value, share)
    print(f"{a.run_dir}: {len(table)} candidates from {prompts} prompts; top t = {t}; the run dropped "
          f"{counts.get('deduped', '?')} at dedup and {counts.get('dropped_opening', '?')} at the opening filter of "
          f"{counts.get('selected_top_t', '?')} chosen")
    more = "" if emb is None else f" {'dedup':>6} {'opening':>8} {'m':>5}"
    print(f"{'rule':<45} {'kept':>6} {'a prompt':>9} {'Eq.1 med':>9} {'no question':>12} {'top t':>6}{more}")
    for r in rows:
        more = "" if emb is None else f" {-r['deduped']:>6} {-r['opening']:>8} {r['questions']:>5}"
        print(f"{r['rule']:<45} {r['kept']:>6} {r['per_prompt'] if r['per_prompt'] is not None else '-':>9} "
              f"{r['quality_median'] if r['quality_median'] is not None else '-':>9} {r['clusters_without']:>12} {r['top_t']:>6}{more}")
    if a.json:
        Path(a.json).write_text(json.dumps({"t": t, "prompts": prompts, "rules": rows}, indent=1))
    by = {(r["share"], r["floor"]): r for r in rows}
    if emb is not None:
        m_doc, m_sent = by[DOCUMENT]["questions"], by[SENTENCE]["questions"]
        print(f"own_cluster_sentence_vs_document_questions: {m_sent / m_doc if m_doc else float('inf'):.4f}")
    doc, sent = by[DOCUMENT]["top_t"], by[SENTENCE]["top_t"]
    print(f"own_cluster_sentence_vs_document_top_t: {sent / doc if doc else float('inf'):.4f}")


if __name__ == "__main__":
    main()
