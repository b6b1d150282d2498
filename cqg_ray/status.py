"""The table `cqg-ray status` prints: each stage's state (done, stale, missing, changed; running or interrupted for the
stage a run is in), its seconds and its headline counts (or all of them), read from the run directory's manifests."""

from __future__ import annotations

from cqg_ray import stages
from cqg_ray.rundir import ArtifactError, RunDir, StageMismatch, StageState, redo_hint


def status_table(run: RunDir, config_hashes: dict[str, str] | None = None) -> list[dict]:
    """One row per stage: state, reason, counts, seconds (with its attempts' that ended unfinished) and attempts. With
    ``config_hashes`` (stage -> hash of the current config) a stage whose config changed is stale."""
    rows = []
    for s in stages.STAGES:
        st = run.state(s.name, (config_hashes or {}).get(s.name), s.reads)
        if st.state == "done":
            try:
                run.verify(s.name, st.manifest)
            except ArtifactError as e:  # StageMismatch, or a Parquet file that no longer reads
                st = StageState(s.name, "changed", "; ".join(e.problems) if isinstance(e, StageMismatch) else str(e), st.manifest)
        m = st.manifest or {}
        earlier = m.get("earlier_attempts_s") or []  # attempts interrupted or failed before the one that finished
        seconds = None if m.get("seconds") is None else m["seconds"] + sum(earlier)
        rows.append({"stage": s.name, "state": st.state, "reason": st.reason, "counts": m.get("counts", {}), "seconds": seconds,
                     "attempts": 1 + len(earlier)})
    return rows


SHOWN_COUNTS = 6  # counts a stage's line shows: its headline ones first (`stages.Stage.headline`), then the others in order


def shown_counts(stage: str, counts: dict, every: bool = False) -> list[tuple[str, object]]:
    """The (name, value) counts a stage's status line shows: its headline counts first, then the rest in the manifest's
    order, SHOWN_COUNTS of them (``every``: all)."""
    first = [k for k in stages.get(stage).headline if k in counts]
    order = first + [k for k in counts if k not in first]
    return [(k, counts[k]) for k in (order if every else order[:SHOWN_COUNTS])]


def format_status(run: RunDir, config_hashes: dict[str, str] | None = None, live: tuple[str, str, str] | None = None,
                  every: bool = False) -> str:
    """The table `cqg-ray status` prints: one line per stage (state, seconds, its headline counts or ``every`` count,
    why stale). ``live``: (stage, "running" or "interrupted", its progress) for the stage a run is in, shown in place of
    missing or stale."""
    rows, cells = status_table(run, config_hashes), []
    for r in rows:
        counts = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown_counts(r["stage"], r["counts"], every))
        counts += f"  ({r['reason']})" if r["state"] in ("stale", "changed") else ""
        counts += f"  (seconds over {r['attempts']} runs)" if r["attempts"] > 1 else ""
        if live is not None and live[0] == r["stage"] and r["state"] != "done":
            r["state"], counts = live[1], live[2]
        cells.append((r["stage"], r["state"], f"{r['seconds']:.1f}" if r["seconds"] is not None else "-", counts))
    w = max(8, *(len(c[1]) for c in cells))  # the state column as wide as its widest word ("interrupted"): the columns line up
    lines = [f"run: {run.root_uri}", f"{'stage':<12} {'state':<{w}} {'seconds':>9}  counts"]
    lines += [f"{stage:<12} {state:<{w}} {secs:>9}  {rest}" for stage, state, secs, rest in cells]
    if any(r["state"] == "changed" for r in rows):
        lines.append("changed: the stage's folder no longer matches its manifest; " + redo_hint(next(r["stage"] for r in rows if r["state"] == "changed")))
    return "\n".join(lines)
