"""The model folder's files: where a model named without a path is found (the shipped models), and its files read
and checked (``ModelError`` naming the file where one is missing, damaged or unreadable)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cqg_ray.rundir import ArtifactError, RunDir

MODELS_ENV = "CQG_RAY_MODELS"  # folders (os.pathsep-separated) where models named without a path are looked for
STATS = "stats.safetensors"


def model_dirs() -> list[Path]:
    """Where a model given by bare name is looked for: $CQG_RAY_MODELS, ./models, the models the wheel carries
    (cqg_ray/models, see setup.py), then the source checkout's models/."""
    dirs = [Path(d) for d in os.environ.get(MODELS_ENV, "").split(os.pathsep) if d]
    here = Path(__file__).resolve().parents[1]  # cqg_ray/
    dirs += [Path("models"), here / "models", here.parent / "models"]
    return dirs


def shipped_models() -> list[str]:
    """Names of the model folders found in ``model_dirs()``."""
    names = {p.parent.name for d in model_dirs() if d.is_dir() for p in d.glob("*/config.json")}
    return sorted(names)


def resolve_model(path_or_name: str) -> str:
    """The folder of a model: a path or URI as given; a bare name (no '/') that is not a model folder here (a folder
    with a config.json, or a file) -> models/<name>."""
    s = str(path_or_name)
    here = os.path.exists(s) and (not os.path.isdir(s) or os.path.isfile(os.path.join(s, "config.json")))
    if "://" in s or "/" in s or os.sep in s or here:
        return s
    for d in model_dirs():
        if (d / s / "config.json").is_file():
            return str(d / s)
    return s


def is_shipped_name(path_or_name: str) -> bool:
    """Whether a model is named by its shipped name (``resolve_model`` finds it in ``model_dirs()``), not by a path."""
    return resolve_model(path_or_name) != str(path_or_name)


class ModelError(ArtifactError):
    """A missing, corrupt or inconsistent model folder."""


def sha256(data: bytes) -> str:
    """The hex sha256 of a file's bytes, as config.json's ``sha256`` records it."""
    import hashlib

    return hashlib.sha256(data).hexdigest()


def check_digest(data: bytes, name: str, path: str, cfg: dict) -> None:
    """ModelError where config.json's ``sha256`` records another checksum for a weights file's bytes (a folder saved
    before checksums records none: not checked). Called once the file has parsed, so that a file that does not names
    its own fault."""
    want = (cfg.get("sha256") or {}).get(name)
    if want is not None and sha256(data) != want:
        raise ModelError(f"{path}/{name} is damaged or was changed after the model was saved: its sha256 is not the one "
                         "config.json records")


def read_stats(run: RunDir, name: str, path: str, cfg: dict) -> tuple[np.ndarray, str]:
    """(mean, the source recorded in the file's metadata) of a stats.safetensors."""
    from cqg_ray.mbqa.heads import safetensors_metadata

    if not run.exists(name):
        raise ModelError(f"missing artifact: {path}/{name} (config.json names it)")
    from safetensors.numpy import load

    data = run.read_bytes(name)
    try:
        t = load(data)
        meta = safetensors_metadata(data)
    except Exception as e:  # safetensors raises its own error types for corrupt bytes
        raise ModelError(f"{path}/{name} is not a readable safetensors file: {e}") from None
    if "mean" not in t or t["mean"].ndim != 1:
        raise ModelError(f"{path}/{name} must hold a 1-d tensor 'mean'")
    check_digest(data, name, path, cfg)
    return t["mean"], str(meta.get("source", ""))


def read_questions(run: RunDir, path: str) -> list[dict]:
    """A model folder's questions.json: its question records, checked (a list of objects with a 'text')."""
    questions = read_json(run, "questions.json")
    if not isinstance(questions, list) or not all(isinstance(q, dict) and "text" in q for q in questions):
        raise ModelError(f"{path}/questions.json must be a list of objects with a 'text'")
    return questions


def read_json(run: RunDir, name: str):
    """A JSON file of the folder; ModelError where it is missing or does not parse."""
    try:
        return run.read_json(name)
    except ArtifactError as e:
        raise ModelError(str(e)) from None
