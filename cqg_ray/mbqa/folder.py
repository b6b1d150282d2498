"""Where a model named without a path is found: the shipped model folders, and a name's resolution to its folder."""

from __future__ import annotations

import os
from pathlib import Path

MODELS_ENV = "CQG_RAY_MODELS"  # folders (os.pathsep-separated) where models named without a path are looked for


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
