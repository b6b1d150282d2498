"""The pipeline's stages, in run order: the one place that names them.

The CLI (a subcommand per stage), the config hash (``config.stage_hash``), the run directory's manifests and
``status``, and the pipeline runner (``cqg-ray run``, also the `ray job submit` entrypoint) all read ``STAGES``.

    stage = get("cqg")            # by command or by name
    stage.name, stage.reads       # 'questions', ('cluster', 'prepare', 'encode')

A stage's name is the noun it writes (its folder: questions, labels, model, evaluation); its command is the verb
that writes it (cqg, label, train, evaluate-run). Wherever a stage is named (--until, --force, status), either works.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Stage:
    name: str  # its folder in the run directory, and its key in manifests and `cqg-ray status`
    command: str  # `cqg-ray <command>`
    reads: tuple[str, ...]  # the stages whose outputs it reads (a change in one makes this one stale)
    hashed: tuple[str, ...]  # the config values that decide its output, as dotted paths into PipelineConfig
    function: str  # "module:function" that runs it, called as function(section or config, ctx); imported when it runs
    takes: str  # the config section that function takes ("" for the whole PipelineConfig)
    help: str
    unhashed: tuple[str, ...] = ()  # dotted paths inside `hashed` sections left out of the hash (never change the output, or hashed by a part)
    models: Callable[[Any], dict[str, str | None]] = lambda cfg: {}  # the model settings it loads in the driver's reach: {dotted path: value}
    headline: tuple[str, ...] = ()  # the counts `cqg-ray status` shows first (then the others in the manifest's order)

    def load_function(self) -> Callable[[Any, Any], None]:
        """The stage function, imported now."""
        module, name = self.function.split(":")
        return getattr(importlib.import_module(module), name)

    def run(self, cfg: Any, ctx: Any) -> None:
        """Run the stage on ``cfg`` (a PipelineConfig), writing under ``ctx`` (a rundir.StageContext)."""
        self.load_function()(getattr(cfg, self.takes) if self.takes else cfg, ctx)


def encoder_model(cfg) -> dict[str, str | None]:
    return {"encode.model": cfg.encode.model}


def question_models(cfg) -> dict[str, str | None]:
    """The encoder (questions dedups with it), and the writer's and the probes' answerer's GGUF or the OpenAI server's
    local tokenizer (the prompt-length guard's)."""
    llm, models = cfg.llm, encoder_model(cfg)
    if llm.backend == "llamacpp":
        models.update({"cqg.writer_model": cfg.cqg.writer_model, "llm.llamacpp.model": llm.llamacpp.model})
    if llm.backend == "openai":
        models["llm.openai.tokenizer"] = llm.openai.tokenizer
    return models


def label_models(cfg) -> dict[str, str | None]:
    llm = cfg.llm
    if llm.backend == "llamacpp":
        return {"label.model": cfg.label.model} if cfg.label.model else {"llm.llamacpp.model": llm.llamacpp.model}
    return {"llm.openai.tokenizer": llm.openai.tokenizer} if llm.backend == "openai" else {}


def evaluation_models(cfg) -> dict[str, str | None]:
    """The encoder the model loads, and the faithfulness task's models (`faithfulness_models`)."""
    return {**encoder_model(cfg), **faithfulness_models(cfg.evaluate)}


def faithfulness_models(evaluate) -> dict[str, str | None]:
    """Where ``evaluate`` (an EvaluateConfig) asks for faithfulness, its judge's and (with links) its labeller's GGUF or
    local tokenizer."""
    models, faith = {}, evaluate.faithfulness
    if "faithfulness" in evaluate.tasks:
        for name, section in [("judge", faith.judge)] + ([("labeller", faith.labeller)] if faith.links else []):
            key = f"evaluate.faithfulness.{name}"
            if section.backend == "llamacpp":
                models[f"{key}.llamacpp.model"] = section.llamacpp.model
            if section.backend == "openai":
                models[f"{key}.openai.tokenizer"] = section.openai.tokenizer
    return models


STAGES: tuple[Stage, ...] = (
    Stage("prepare", "prepare", (), ("corpus",), "cqg_ray.corpus:prepare", "corpus",
          "read, clean, dedup and shard the corpus (corpus.*)"),
    Stage("encode", "encode", ("prepare",), ("encode.model", "encode.dtype", "encode.max_seq_length"),
          "cqg_ray.encode:run_encode", "",
          "encode every document with the frozen sentence encoder (encode.*)", models=encoder_model),
    Stage("cluster", "cluster", ("encode",), ("cluster",), "cqg_ray.cluster:cluster", "cluster",
          "faiss k-means, assignments and centroid neighbours (cluster.*: k)"),
    Stage("questions", "cqg", ("cluster", "prepare", "encode"), ("cqg", "llm.identity", "encode.model", "llm.answer_mode"),
          "cqg_ray.cqg.stage:run_cqg", "",
          "contrastive question generation, probing, selection, dedup (cqg.*: n_p n_h n_e p_p p_h p_e t theta)", models=question_models,
          headline=("questions", "clusters", "generated", "probed")),
    Stage("labels", "label", ("questions", "cluster", "prepare"), ("label", "llm.identity", "llm.answer_mode"),
          "cqg_ray.mbqa.label:run_labels", "",
          "LLM answers for MBQA training: one (text, question) a prompt, P(yes) read without decoding, or the paper's 20 a prompt (llm.answer_mode; label.*)",
          models=label_models, headline=("pairs_labelled", "questions", "texts", "yes_rate", "prompts_failed")),
    Stage("model", "train", ("labels", "encode", "questions"), ("train",), "cqg_ray.mbqa.stage:run_train", "",
          "train the MBQA heads (one Ray task, or Ray Train for several workers: train.trainer) and save the model folder (train.*: alpha tau)",
          unhashed=("train.trainer",),  # one Ray task or Ray Train's one worker: the same heads to the bit (tested)
          headline=("questions", "questions_dropped", "pairs", "heldout_accuracy")),
    Stage("evaluation", "evaluate-run", ("model",),
          ("evaluate", *(f"evaluate.faithfulness.{llm}.{part}" for llm in ("judge", "labeller") for part in ("identity", "answer_mode"))),
          "cqg_ray.evaluate.stage:run_evaluation", "",
          "evaluate the run's model (evaluate.*)",
          unhashed=("evaluate.faithfulness.judge", "evaluate.faithfulness.labeller"),  # their identity only, as llm for the LLM stages
          models=evaluation_models),
)

NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
COMMANDS: tuple[str, ...] = tuple(s.command for s in STAGES)


def find(name_or_command: str) -> Stage | None:
    """The stage with this name or command, or None."""
    return next((s for s in STAGES if name_or_command in (s.name, s.command)), None)


def get(name_or_command: str) -> Stage:
    """The stage with this name or command; ValueError naming the stages otherwise."""
    stage = find(name_or_command)
    if stage is None:
        raise ValueError(f"unknown stage {name_or_command!r}; stages: {', '.join(COMMANDS)}")
    return stage
