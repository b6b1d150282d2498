"""The CQG report: counts per step, LLM usage, a quality histogram, and sample questions with their cluster's texts."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from cqg_ray.rundir import RunDir


def quality_histogram_png(q_all: np.ndarray, q_selected: np.ndarray, title: str) -> bytes:
    try:
        import matplotlib
    except ImportError:
        raise ImportError('the question-quality histogram needs matplotlib: pip install "cqg-ray[plots]"') from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    bins = np.linspace(-1, 1, 21)
    ax.hist(q_all[~np.isnan(q_all)], bins=bins, color="#b0b7c3", label=f"all probed ({int(np.sum(~np.isnan(q_all)))})")
    ax.hist(q_selected[~np.isnan(q_selected)], bins=bins, color="#2b6cb0", label=f"selected ({len(q_selected)})")
    ax.set_xlabel("quality = yes-rate(positives) - yes-rate(negatives)   (Eq. 1)")
    ax.set_ylabel("questions")
    ax.set_title(title)
    ax.legend(frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_report(run: RunDir, stage: str, cfg, candidates: pa.Table, texts: dict[str, str], doc_ids: np.ndarray, gen, counts: dict, llm: dict,
                 n_clusters_shown: int = 3) -> None:
    q = candidates.column("quality").to_numpy(zero_copy_only=False)
    kept = candidates.column("kept").to_numpy(zero_copy_only=False)
    run.write_bytes(f"{stage}/quality_hist.png", quality_histogram_png(q, q[kept], f"{cfg.cqg.method.upper()} question quality"))
    lines = [f"# Question generation report ({cfg.cqg.method})", "",
             f"Settings: n_p={cfg.cqg.n_p} n_h={cfg.cqg.n_h} n_e={cfg.cqg.n_e}, p_p={cfg.cqg.p_p} p_h={cfg.cqg.p_h} p_e={cfg.cqg.p_e}, "
             f"t={cfg.cqg.t}, theta={cfg.cqg.theta_value}; prompt {cfg.cqg.prompt if cfg.cqg.method == 'cqg' else 'A.2'}, "
             f"writer {cfg.cqg.writer_model or 'the run LLM'}, filters {', '.join(cfg.cqg.filters) or 'none'}",
             "", "## Counts", "", "| step | count |", "|---|---:|"]
    for k in ("clusters", "generation_prompts", "generation_failed", "generated", "dropped_empty", "dropped_not_yes_no", "dropped_duplicate",
              "parsed", "dropped_copy", "dropped_example", "dropped_long", "dropped_cut_off", "probe_prompts", "probe_failed", "probed",
              "dropped_own_cluster",
              "selected_top_t", "deduped", "dropped_opening", "questions"):
        if k in counts:
            lines.append(f"| {k} | {counts[k]} |")
    lines += ["", "## Eq. 1 quality of kept and dropped questions", "", "| probed questions | n | p25 | median | p75 |", "|---|---:|---:|---:|---:|"]
    for label, mask in (("kept", kept), ("not kept", ~kept)):
        v = q[mask & ~np.isnan(q)]
        cells = [f"{x:.2f}" for x in np.percentile(v, [25, 50, 75])] if len(v) else ["-"] * 3
        lines.append(f"| {label} | {len(v)} | {' | '.join(cells)} |")
    if "generation_prompts_checked" in counts:
        lines += ["", "## Prompt length against the engine's context", "",
                  "| prompts | checked | clipped | texts dropped | characters cut | longest prompt counted (tokens) |", "|---|---:|---:|---:|---:|---:|"]
        for step in ("generation", "probe"):
            lines.append(f"| {step} | {counts[f'{step}_prompts_checked']} | {counts[f'{step}_prompts_clipped']} | {counts[f'{step}_texts_dropped']} | "
                         f"{counts[f'{step}_chars_cut']} | {counts[f'{step}_longest_prompt_tokens'] or '- (none needed counting)'} |")
    lines += ["", "## LLM usage", "", "| step | requests | prompt tokens | completion tokens | failures | retries |", "|---|---:|---:|---:|---:|---:|"]
    for step, s in llm.items():
        lines.append(f"| {step} | {s.get('requests', '')} | {s.get('prompt_tokens', '')} | {s.get('completion_tokens', '')} | "
                     f"{s.get('failures', s.get('failed', ''))} | {s.get('retries', '')} |")
    lines += ["", "![quality histogram](quality_hist.png)", "", "## Sample clusters", ""]
    cl = candidates.column("cluster").to_numpy()
    by_cluster: dict = {}
    for s in gen:
        by_cluster.setdefault(s.cluster, s)  # a cluster's first generation sample
    shown = 0
    for c in sorted(set(cl[kept].tolist())):
        if shown >= n_clusters_shown:
            break
        shown += 1
        s = by_cluster.get(c)
        lines.append(f"### Cluster {c}")
        if s is not None:
            lines.append("Positive texts:")
            for i in s.positives[:3]:
                t = texts.get(str(doc_ids[i]), "")
                lines.append(f"> {t[:200]}{'...' if len(t) > 200 else ''}")
                lines.append("")
        lines.append("| question | quality | yes-rate pos | yes-rate neg | selected |")
        lines.append("|---|---:|---:|---:|:---:|")
        rows = candidates.filter(pa.compute.equal(candidates["cluster"], c)).sort_by([("quality", "descending")]).to_pylist()
        for r in rows:
            fmt = lambda v: "-" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.2f}"  # noqa: E731
            lines.append(f"| {r['text']} | {fmt(r['quality'])} | {fmt(r['positive_yes_rate'])} | {fmt(r['negative_yes_rate'])} | "
                         f"{'yes' if r['kept'] else ''} |")
        lines.append("")
    run.write_bytes(f"{stage}/report.md", "\n".join(lines).encode())
