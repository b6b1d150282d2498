"""Tests of bench/ and scripts/ files, which are run by path rather than imported from the package."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str, name: str):
    """The file ``relpath`` (from the repository root, e.g. "bench/scale.py") loaded as module ``name``, registered in
    sys.modules first so that its dataclasses resolve."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
