"""The configs shipped inside the package, named by their file stem: ``--config demo`` anywhere cqg-ray is installed.

    demo.yaml        the embedded demo (`cqg-ray demo`): local Ray, CPU, the bundled encoder and LLM
    reference.yaml   the shipped reference model (models/cqg-minilm-ref)
    paper.yaml       the paper's full-scale run on a GPU Ray cluster
    serve.yaml       a Ray Serve deployment (`serve deploy`), not a pipeline config

    config_file("demo")               # -> .../cqg_ray/configs/demo.yaml
    config_file("my/run.yaml")        # a path is returned as it is
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def packaged() -> dict[str, Path]:
    """Stem -> file of every config shipped in this folder."""
    root = resources.files(__name__)
    return {Path(f.name).stem: Path(str(f)) for f in root.iterdir() if f.name.endswith(".yaml")}


def config_file(name_or_path: str | Path) -> Path:
    """An existing path as it is; else a bare name (``demo`` or ``demo.yaml``) of a packaged config; else the path
    unchanged (so that reading it raises ``FileNotFoundError``)."""
    path = Path(name_or_path)
    if path.exists() or len(path.parts) != 1:
        return path
    return packaged().get(path.stem if path.suffix == ".yaml" else path.name, path)
