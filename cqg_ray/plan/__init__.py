"""Capacity planner (`cqg-ray plan`): LLM requests, tokens, encoder passes and GPU hours of a run, before running it.

A pure function of the config (plus a few workload and throughput figures):

    p = capacity_plan(cfg, docs=6_800_000)              # cfg: a PipelineConfig (load_config("paper") for the paper)
    p["counts"]["questions"], p["counts"]["label_pairs"], p["stages"][i]["prompt_tokens"], p["totals"]["gpu_hours"]

How each count is derived (N texts, k clusters; paper symbols of Table 8 and Appendix B):

- CQG generation (A.1): ``cqg.prompts_per_cluster`` prompts per cluster (paper: 1; ``cqg.max_clusters`` caps k) with
  n_p + n_h + n_e texts (QAEmb: ``qaemb_articles`` texts), asking for ``cqg.questions_per_prompt`` questions (paper: 10),
  written by ``cqg.writer_model`` or the llm's model, so the candidates are k x prompts x 10 (times ``parse_rate``, the
  share of the questions asked that parse as yes/no questions); ``filter_survival`` of them pass ``cqg.filters``
  (measured by ``--calibrate RUN_DIR`` from a finished questions stage, or given).
- Probing (Equation 1), as ``cqg_ray.cqg.stage`` does it: per cluster, p_p + p_h + p_e probe texts shared by the
  cluster's questions. Packed (``llm.answer_mode: packed``, as paper.yaml): one A.3 prompt per probe text with the
  cluster's candidates (in chunks of ``label.questions_per_prompt``): k x (p_p + p_h + p_e) x ceil(10 / 20) prompts.
  Single-pass (the default): one request per (probe text, candidate), the text's prefix shared.
- Selection: top t per cluster (at most the cluster's filtered candidates) -> k x t, then dedup at theta keeps a fraction ``dedup_survival`` of them
  (default: the paper's 9,614 / 20,000 for CQG, 10,654 / 20,000 for QAEmb, Appendix D): m questions.
- Labelling (Appendix B): m x min(n_cluster + n_neighbor + n_random, N) (text, question) pairs. The paper packs
  20 questions per prompt: pairs / 20 prompts at full packing (10M pairs -> 500k prompts). Our packing
  (``cqg_ray.mbqa.label_plan``) groups a text's questions, so the prompts are "one per (text, 20 of its questions)"; its
  count is estimated by ``label_packing_estimate`` (derivation there) and can be checked exactly on a synthetic
  balanced clustering with ``simulate_label_packing`` (``--simulate``). Single-pass (the default): one request per
  pair (``plan.capacity``).
- Encoder passes: the corpus (N texts), the k x 10 candidate questions (dedup), and the final embedding pass over
  ``embed_docs`` texts (default N; the MBQA heads cost nothing beside the encoder).
- Tokens: every prompt is built with the real prompt functions (``cqg_ray.llm.prompts``) on empty slots, its
  length in characters divided by ``chars_per_token`` plus a chat-template overhead; each text adds
  ``prompt_tokens_per_text`` (capped by the stage's max_text_chars), each question ``question_tokens``; an answer
  costs ``answer_tokens`` per question ("1. yes\\n").
- Time: an LLM stage takes prompt_tokens / prompt rate + completion_tokens / completion rate device-seconds
  (prefill and decode counted one after the other: conservative for vLLM's continuous batching); an encoder pass
  texts / encoder rate; training epochs x labelled pairs x (1 - holdout) / pairs rate; k-means on the CPU, from
  its flop count (2 n k d per iteration) at the per-core rate our faiss benchmark measured. Wall hours divide
  device hours by the number of GPUs (one LLM replica / encoder actor / train worker per GPU).

Throughput presets (``THROUGHPUTS``): "gpu" holds assumed figures for one H100-class GPU (not measured here: no
GPU and no model weights on the build machine), "cpu" the figures measured on this project's 2-core machine. Every
figure can be overridden.

Modules: ``capacity`` (the plan), ``tokens`` (the token model), ``packing`` (labelling prompts: estimate and
simulation), ``throughput`` (presets, ``calibrate``), ``memory`` (predicted peak memory of the driver and each worker kind, per
stage), ``format`` (counts and the table), ``cli``.
"""

from cqg_ray.plan.capacity import capacity_plan
from cqg_ray.plan.cli import add_commands
from cqg_ray.plan.format import format_plan, human, parse_count
from cqg_ray.plan.packing import label_packing_estimate, simulate_label_packing
from cqg_ray.plan.throughput import THROUGHPUTS, Throughput, calibrate
from cqg_ray.plan.tokens import Workload

__all__ = ["THROUGHPUTS", "Throughput", "Workload", "add_commands", "calibrate", "capacity_plan", "format_plan", "human",
           "label_packing_estimate", "parse_count", "simulate_label_packing"]
