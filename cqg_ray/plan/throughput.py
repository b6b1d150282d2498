"""Per-device processing rates: the presets, and ``calibrate`` from a finished run's manifests and ledgers."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Throughput:
    """Per-device processing rates (one GPU, or one 2-core machine for "cpu")."""

    llm_prompt_tokens_per_s: float
    llm_completion_tokens_per_s: float
    encoder_texts_per_s: float
    train_pairs_per_s: float
    device: str
    source: str
    writer_prompt_tokens_per_s: float | None = None  # the question writer's, where it is another model or engine (None: the LLM's)
    writer_completion_tokens_per_s: float | None = None

    @property
    def writer(self) -> tuple[float, float]:
        """(prompt, completion) tokens/s of the model that writes the questions."""
        return (self.writer_prompt_tokens_per_s or self.llm_prompt_tokens_per_s,
                self.writer_completion_tokens_per_s or self.llm_completion_tokens_per_s)


THROUGHPUTS = {
    "gpu": Throughput(
        llm_prompt_tokens_per_s=10_000, llm_completion_tokens_per_s=2_500, encoder_texts_per_s=1_500, train_pairs_per_s=1_000_000,
        device="GPU",
        source="ASSUMED for one H100-class GPU (not measured by this project): vLLM offline batch with a 7-8B bf16 model "
               "(prefill 10k tok/s, decode 2.5k tok/s), UAE-Large-V1 fp16 on ~128-token texts 1,500 texts/s, "
               "MBQA heads 1M pairs/s; replace them with your own measurements",
    ),
    "cpu": Throughput(
        llm_prompt_tokens_per_s=220, llm_completion_tokens_per_s=27, encoder_texts_per_s=500, train_pairs_per_s=100_000,
        device="2-core CPU machine",
        source="MEASURED on this project's 2-core machine: llama.cpp Qwen2.5-Coder-0.5B Q4_K_M with 2 threads "
               "(220 prompt tok/s, 27 generated tok/s), MiniLM-L6 through a Ray Data actor pool (500 texts/s); "
               "MBQA heads (run_epochs, 1 thread, d=384, 300 heads) 99-121k pairs/s",
    ),
}


LLM_LEDGER_STAGES = ("cqg-generate", "cqg-probe", "qaemb-generate", "qaemb-probe", "labels")


def calibrate(run_dir: str, base: Throughput) -> Throughput:
    """Throughputs measured by a finished (small) run on the hardware you will use, in place of the preset's.

    Encoder: the encode manifest's texts/s. LLM: each ledger stage's totals give wall_s = P / R_prompt + C / R_output
    (P, C: its prompt tokens read, those a prefix cache served left out as the plan counts them, and its output
    tokens); generation (long outputs) and probing/labelling (short outputs) make the
    system solvable by least squares; with one stage, or a non-positive solution, one rate (P + C) / wall is used for
    both. Training: the final epoch's pairs/s. Rates describe the calibration run's whole setup (all its GPUs or
    actors): plan with --gpus relative to it."""
    from cqg_ray.rundir import RunDir

    run = RunDir(run_dir)
    if not run.exists():
        raise ValueError(f"no run directory at {run_dir}")
    changes: dict[str, float] = {}
    used = []
    enc = run.manifest("encode")
    if enc and enc.get("counts", {}).get("texts_per_s"):
        changes["encoder_texts_per_s"] = float(enc["counts"]["texts_per_s"])
        used.append(f"encode {changes['encoder_texts_per_s']:g} texts/s")
    rows = []
    for stage in LLM_LEDGER_STAGES:
        if run.exists("llm", "ledger", stage, "_stats.json"):
            stats = run.read_json(f"llm/ledger/{stage}/_stats.json")
            t = stats.get("totals", {})
            cached = sum(r.get("cached_prompt_tokens") or 0 for r in stats.get("runs", []))  # read once for many prompts
            read = t.get("prompt_tokens", 0) - cached
            if t.get("wall_s", 0) > 0 and read + t.get("completion_tokens", 0) > 0:
                rows.append((float(read), float(t["completion_tokens"]), float(t["wall_s"]), stage))
    if rows:
        A = np.array([[r[0], r[1]] for r in rows])
        wall = np.array([r[2] for r in rows])
        inv = np.linalg.lstsq(A, wall, rcond=None)[0] if len(rows) >= 2 else np.array([-1.0, -1.0])
        if np.all(inv > 0):
            changes["llm_prompt_tokens_per_s"], changes["llm_completion_tokens_per_s"] = float(1 / inv[0]), float(1 / inv[1])
        else:
            rate = float(A.sum() / wall.sum())
            changes["llm_prompt_tokens_per_s"] = changes["llm_completion_tokens_per_s"] = rate
        used.append(f"LLM ledgers {', '.join(r[3] for r in rows)}")
    model = run.manifest("model")
    pps = ((model or {}).get("final_metrics") or {}).get("pairs_per_s")  # the stage's extra fields sit in its manifest
    if pps:
        changes["train_pairs_per_s"] = float(pps)
        used.append(f"train {pps:g} pairs/s")
    if not changes:
        why = (" (its encode stage finished without encoding a text itself: every unit was kept from an earlier run, "
               "so it timed nothing)" if enc and not enc.get("counts", {}).get("texts_per_s") else "")
        raise ValueError(f"{run_dir} has no finished encode, LLM or train stage to measure throughput from{why}")
    return replace(base, **changes, device=f"setup of {run.root_uri}",
                   source=f"MEASURED by the run {run.root_uri} ({'; '.join(used)}); the rest from the {base.device} preset")


def measured(rates, base: Throughput, source: str) -> Throughput:
    """``base`` with this machine's LLM rates on the config's embedded engines (``cqg_ray.llm.rates.Rates``): the writer's
    reading and writing for generation, the answerer's reading for probes and labels (single-pass: no decoding), its
    decoding (packed answers) at the writer's rate."""
    return replace(base, llm_prompt_tokens_per_s=rates.answer_read, llm_completion_tokens_per_s=rates.write,
                   writer_prompt_tokens_per_s=rates.read, writer_completion_tokens_per_s=rates.write, device="this machine",
                   source=f"MEASURED on this machine's embedded engines ({source}): the writer reads {rates.read:.0f} prompt tokens/s "
                          f"and writes {rates.write:.1f}, the answerer reads {rates.answer_read:.0f}; the rest from the {base.device} preset")
