"""`cqg-ray export RUN OUT`: a run's trained model as a self-contained folder to ship, with how it was built.

OUT gets the model folder (config.json, questions.json with each question's LLM yes-rate, heads.safetensors,
the held-out report eval_report.json / eval_report.md) plus

    run_config.yaml   the run's whole config (rebuild with `cqg-ray run --config run_config.yaml`)
    build.json        each stage's wall time, counts and LLM usage, the machine, the versions
    README.md         a model card: sizes, build times, how to load it

`cqg-ray evaluate OUT` then writes OUT/evaluation/ (report, results, sweep plots). Load the result with
``InterpretableEmbedder.load(OUT)``, or by its folder name when it lies in models/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from cqg_ray.config import ConfigError, config_data, config_from_dict, stage_hash
from cqg_ray.hardware import cpu_flags, cpu_model, max_isa
from cqg_ray.rundir import ArtifactError, RunDir
from cqg_ray.stages import NAMES

log = logging.getLogger("cqg_ray")

MODEL_FILES = ("heads.safetensors", "stats.safetensors", "questions.json", "eval_report.json", "eval_report.md", "config.json")  # config.json last
BUILD_STAGES = tuple(n for n in NAMES if n != "evaluation")  # the stages that build a model
NEW, REPLACED = ".export-", ".replaced-"  # beside OUT during the swap: the folder being written, the model it replaces


def cpu_name() -> str:
    """The CPU model and the vector extensions that matter here, e.g. 'AMD EPYC (avx512_bf16, avx512f), 2 cores'."""
    shown = sorted(cpu_flags(capped=False) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    capped = f"; kernels capped at {max_isa().upper()}" if max_isa() else ""
    return f"{cpu_model()} ({', '.join(shown) or 'no AVX2'}{capped}), {os.cpu_count()} cores"


def build_record(run: RunDir) -> dict:
    """Wall time, counts and LLM usage of each finished stage of a run (from the stage manifests)."""
    stages = {}
    for stage in BUILD_STAGES:
        man = run.manifest(stage)
        if man is None:
            continue
        stages[stage] = {"seconds": man.get("seconds"), "counts": man.get("counts", {}), "finished_at": man.get("finished_at")}
        if man.get("llm"):
            stages[stage]["llm"] = man["llm"]
        for key in ("prompt", "writer"):  # the cqg stage: which generation prompt, which model wrote the questions
            if key in man:
                stages[stage][key] = man[key]
    # a stage's LLM usage is one record, or one per phase ({"generate": {...}, "probe": {...}})
    llm = [x for s in stages.values() if "llm" in s for x in ([s["llm"]] if "requests" in s["llm"] else s["llm"].values())]
    model = run.manifest("model") or {}
    return {
        "stages": stages,
        "total_seconds": round(sum(s["seconds"] or 0 for s in stages.values()), 1),
        "llm_requests": sum(int(x.get("requests", 0)) for x in llm),
        "llm_prompt_tokens": sum(int(x.get("prompt_tokens", 0)) for x in llm),
        "llm_completion_tokens": sum(int(x.get("completion_tokens", 0)) for x in llm),
        "machine": cpu_name(),
        "versions": model.get("versions", {}),
    }


def model_card(name: str, cfg: dict, build: dict, questions: list[dict], report: dict | None) -> str:
    """README.md of a shipped model: what it is, how it was built, how to use it."""
    st = build["stages"]
    rows = "\n".join(f"| {k} | {v['seconds']:.0f} | {', '.join(f'{a}={b}' for a, b in list(v['counts'].items())[:6])} |"
                     for k, v in st.items() if v.get("seconds") is not None)
    llm = cfg.get("llm", {})
    llm_model = llm.get(llm.get("backend", "llamacpp"), {}).get("model", "?")
    rates = [q["yes_rate"] for q in questions if q.get("yes_rate") is not None]
    yes = f"Mean LLM yes-rate over the labelled texts {sum(rates) / len(rates):.3f}; " if rates else ""
    acc = f"held-out accuracy {report['accuracy']:.2f}, macro F1 {report['macro avg']['f1-score']:.2f}" if report and "accuracy" in report else ""
    return f"""# {name}

A CQG-MBQA interpretable embedding model built by cqg-ray: {len(questions)} yes/no questions, one MLP head each on the
frozen encoder `{cfg.get('encode', {}).get('model', '?')}`; questions written and texts labelled by `{llm_model}`
({llm.get('backend', 'llamacpp')}, answer mode `{llm.get('answer_mode', 'single')}`).
{yes}{acc}.

```python
from cqg_ray import InterpretableEmbedder
model = InterpretableEmbedder.load("{name}")        # or the path of this folder
bits = model.encode(["A man is playing a guitar.", "Someone plays music."])   # (2, {len(questions)}) 0/1
print(model.explain("A man is playing a guitar.", "Someone plays music."))   # the questions both answer yes
```

Built with `cqg-ray run --config run_config.yaml` on {build['machine']}, {build['total_seconds'] / 60:.1f} min in all,
{build['llm_requests']:,} LLM requests ({build['llm_prompt_tokens']:,} prompt tokens, {build['llm_completion_tokens']:,} generated):

| stage | seconds | counts |
|---|---:|---|
{rows}

Files: `config.json` (with the budget), `questions.json` (text, cluster, probe quality, labels, LLM yes-rate), `heads.safetensors`, `stats.safetensors`,
`eval_report.md` (held-out question answering, the paper's Table 6), `run_config.yaml`, `build.json`, and
`evaluation/` (`cqg-ray evaluate` on the standard sets: report, results, the load frontier, tau and m sweeps).
"""


def recover_interrupted(out: str) -> None:
    """What an export killed mid-swap left beside ``out``: the model it was replacing (``OUT.replaced-*``) goes back in
    place when ``out`` is missing (killed between the two renames), else away (killed before removing it); an
    unfinished new folder (``OUT.export-*``) goes."""
    import glob
    import shutil

    base = os.path.normpath(out)
    replaced = sorted(glob.glob(glob.escape(base + REPLACED) + "*"), key=os.path.getmtime)
    if replaced and not os.path.exists(base) and os.path.isfile(os.path.join(replaced[-1], "config.json")):
        os.replace(replaced.pop(), base)
        log.warning("%s was missing after an interrupted export: the model it was replacing is back in place", out)
    for d in replaced + glob.glob(glob.escape(base + NEW) + "*"):
        shutil.rmtree(d, ignore_errors=True)


def export_model(run_dir: str, out: str, name: str | None = None, overwrite: bool = False) -> dict:
    """Copy the run's model folder to ``out`` with its config, build record and model card. Returns the build record.

    The run's model is loaded (checked) and every file made before anything is written; the new folder is written
    beside ``out`` and swapped in at the end, so a model it replaces stays whole until then (an export killed during
    the swap is put right by the next one: ``recover_interrupted``). Files of ``out`` that export does not write are
    kept, but for ``evaluation/`` where the new model has other questions or heads (it measured the replaced one).
    A folder ``out`` that holds files but no model is refused (an embed output, anything else)."""
    import shutil
    import uuid

    import yaml

    from cqg_ray.artifacts import HEADS_FILES, file_on_path, model_fingerprint, not_a_run, run_config_text
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    run = RunDir(run_dir)
    if (what := not_a_run(run)) is not None:
        raise ArtifactError(f"{run_dir} is not a cqg-ray run directory ({what}): export takes a run that trained a model")
    run.require("model")
    if "://" in out:  # the folder is written with local file calls: s3://b/m became ./s3:/b/m, said as exported to s3://b/m
        raise ArtifactError(f"{out}: export writes a local folder; give a local path, and copy the folder to {out} afterwards")
    recover_interrupted(out)
    if os.path.isfile(out):
        raise ArtifactError(f"{out} is a file: give a folder to export the model to")
    if run.local and os.path.isdir(out) and os.path.samefile(run.path("model"), out):
        raise ArtifactError(f"{out} is the run's own model folder: export to another folder")
    if run.local and os.path.isdir(out) and (os.path.realpath(run.root) + os.sep).startswith(os.path.realpath(out).rstrip(os.sep) + os.sep):
        # the swap would copy the whole run (or every run under OUT) and leave model files beside its stages
        raise ArtifactError(f"{out} is the run directory or a folder that holds it: export to a folder outside the run")
    if os.path.exists(os.path.join(out, "config.json")) and not overwrite:
        raise ArtifactError(f"{out} already holds a model (config.json); pass --overwrite to replace it")
    if os.path.isdir(out) and not os.path.exists(os.path.join(out, "config.json")) and (held := sorted(os.listdir(out))):
        raise ArtifactError(f"{out} holds other files than a model ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}): "
                            "export to a new or empty folder, or over a model folder with --overwrite")
    try:
        InterpretableEmbedder.load(run.uri("model"), device="cpu", load_encoder=False)
    except ArtifactError as e:  # ModelError too
        raise ArtifactError(f"the run's model does not load, nothing exported: {e}") from None
    made = {f: run.read_bytes(f"model/{f}") for f in MODEL_FILES if run.exists("model", f)}
    # the run's config as read (a mapping of sections; ConfigError naming the file when it is not one)
    cfg = config_data(*run_config_text(run)) if run.exists("config.yaml") else {}
    made["run_config.yaml"] = yaml.safe_dump(cfg, sort_keys=False).encode()
    try:
        model_state = run.state("model", stage_hash(config_from_dict(cfg), "model"))
    except ConfigError:
        model_state = None
    if model_state is not None and model_state.state != "done":  # exported as it is, but said
        log.warning("the run's model stage is %s (%s): its run_config.yaml does not rebuild the exported model; "
                    "`cqg-ray run` it first to export one that does", model_state.state, model_state.reason)
    build = build_record(run)
    made["build.json"] = json.dumps(build, indent=2).encode()
    report = run.read_json("model/eval_report.json") if run.exists("model", "eval_report.json") else None
    name = name or os.path.basename(os.path.normpath(out))
    made["README.md"] = model_card(name, cfg, build, run.read_json("model/questions.json"), report if isinstance(report, dict) else None).encode()

    base = os.path.normpath(out)
    part, old = f"{base}{NEW}{uuid.uuid4().hex[:8]}", f"{base}{REPLACED}{uuid.uuid4().hex[:8]}"
    parent = os.path.dirname(base) or "."
    if (above := file_on_path(parent)) is not None:  # OUT's folder: a file on its path is said before anything is written
        raise ArtifactError(f"{above} is a file: give a folder path to export the model to")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise ArtifactError(f"cannot make {parent}: {e.strerror or e}: give a folder path to export the model to") from None
    left = set(made) | set(MODEL_FILES)
    if os.path.isdir(os.path.join(out, "evaluation")) and not (
            all(os.path.isfile(os.path.join(out, f)) for f in HEADS_FILES)
            and model_fingerprint(out, HEADS_FILES) == model_fingerprint(run.uri("model"), HEADS_FILES)):
        left.add("evaluation")
        log.info("%s/evaluation/ measured the model being replaced (other questions or heads): left out", out)
    try:
        if os.path.isdir(out):  # what export does not write stays
            shutil.copytree(out, part, ignore=lambda d, names: [n for n in names if d == out and n in left])
        os.makedirs(part, exist_ok=True)
        for f, data in made.items():  # config.json last (MODEL_FILES' order, then the build files): a folder with it is whole
            if f != "config.json":
                with open(os.path.join(part, f), "wb") as fh:
                    fh.write(data)
        with open(os.path.join(part, "config.json"), "wb") as fh:
            fh.write(made["config.json"])
        if os.path.isdir(out):
            os.replace(out, old)
        try:
            os.replace(part, out)
        except OSError:
            if os.path.isdir(old):  # the old model back in its place
                os.replace(old, out)
            raise
    finally:
        shutil.rmtree(part, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)  # only once the new folder is in place
    return build


def cmd_export(args) -> int:
    build = export_model(args.run_dir, args.out, args.name, args.overwrite)
    print(f"exported {args.run_dir}/model -> {args.out} ({build['total_seconds'] / 60:.1f} min of stages, {build['llm_requests']:,} LLM requests); "
          f"next: cqg-ray evaluate {args.out}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="copy a run's trained model to a folder to ship, with its config, build record and model card",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="run directory with a trained model (local path or URI)")
    p.add_argument("out", help="local folder to write, e.g. models/my-model (not a URI: copy the folder there afterwards)")
    p.add_argument("--name", help="the model's name in its README (default: the folder name)")
    p.add_argument("--overwrite", action="store_true", help="replace a model already in OUT (its evaluation/ stays only where the new "
                                                           "model has its questions and heads)")
    p.set_defaults(func=cmd_export)
