"""Run a cqg-ray model under MTEB's encoder protocol (``pip install cqg-ray[mteb]``; mteb is imported lazily).

    from cqg_ray.evaluate.mteb_adapter import MTEBEncoder
    import mteb
    model = MTEBEncoder.load("runs/demo/model")                    # the model's budgeted vectors (encode(output="sparse"), dense)
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))   # with MTEB's data available locally

MTEB >= 2 calls ``encode(DataLoader of {"text": [...]} batches, *, task_metadata, hf_split, hf_subset,
prompt_type, **kwargs)`` and scores with the model's ``similarity`` / ``similarity_pairwise``; MTEB 1.x calls
``encode(list_of_texts, **kwargs)``. This class accepts both, plus a plain string. Embeddings come back as float32
(n, m) arrays: the model's budgeted vectors (``binary=True``: what ``encode(output="sparse")`` gives, densified;
``tau=`` applies the paper's rule at that tau instead) or the probabilities (``binary=False``). Similarity is
cosine, 0 for an all-zero vector (MTEB rejects NaN scores).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from cqg_ray.evaluate.metrics import l2_normalize
from cqg_ray.evaluate.models import budgeted, is_interpretable, load_model


def texts_of(inputs: Any) -> list[str]:
    """The texts in whatever MTEB hands over: a string, a list of strings, or batches ({"text": [...]} or lists)."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, (list, tuple)) and all(isinstance(t, str) for t in inputs):
        return list(inputs)
    texts: list[str] = []
    for batch in inputs:
        if isinstance(batch, str):
            texts.append(batch)
        elif isinstance(batch, dict):
            if "text" not in batch:
                raise ValueError(f"MTEB batch without a 'text' field (keys: {sorted(batch)}): only text inputs are supported")
            col = batch["text"]
            texts.extend([col] if isinstance(col, str) else list(col))
        elif isinstance(batch, Iterable):
            texts.extend(str(t) for t in batch)
        else:
            raise TypeError(f"cannot read texts from a batch of type {type(batch).__name__}")
    return texts


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def _array(x: Any) -> np.ndarray:
    """A 2-D float32 array from an array, a tensor, or a list of 1-D vectors (MTEB passes all three)."""
    if isinstance(x, list):
        x = np.stack([_numpy(v) for v in x]) if x else np.zeros((0, 0), dtype=np.float32)
    x = _numpy(x)
    return x[None, :] if x.ndim == 1 else x


class MTEBEncoder:
    """A cqg-ray interpretable model (or any ``encode(texts)`` Encoder) behind MTEB's EncoderProtocol."""

    def __init__(self, model: Any, *, binary: bool = True, tau: float | None = None, name: str = "cqg-ray/cqg-mbqa",
                 revision: str | None = None):
        self.model = model
        self.interpretable = is_interpretable(model)
        self.binary = binary and self.interpretable
        self.tau = None if tau is None else float(tau)  # the paper's rule at this tau instead of the model's budget
        self.name = name
        self.revision = revision or "local"
        self._meta = None

    @classmethod
    def load(cls, path: str, **kwargs: Any) -> "MTEBEncoder":
        return cls(load_model(path), **kwargs)

    def encode(self, inputs: Any, *, task_metadata: Any = None, hf_split: str | None = None, hf_subset: str | None = None,
               prompt_type: Any = None, **kwargs: Any) -> np.ndarray:
        """(n, m) float32 embeddings; MTEB's extra arguments (batch_size, show_progress_bar, prompts...) are accepted
        and ignored: the model batches on its own and uses no prompts."""
        texts = texts_of(inputs)
        if not self.interpretable:
            return np.asarray(self.model.encode(texts), dtype=np.float32)
        probs = np.asarray(self.model.encode(texts, output="probs"), dtype=np.float32)
        if not self.binary:
            return probs
        from cqg_ray.mbqa.budget import Budget

        return budgeted(self.model, probs, None if self.tau is None else Budget(rule="tau", tau=self.tau))

    def similarity(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity matrix (n1, n2)."""
        return np.asarray(l2_normalize(_array(embeddings1)) @ l2_normalize(_array(embeddings2)).T, dtype=np.float32)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Cosine similarity of each pair of rows (n,)."""
        a, b = l2_normalize(_array(embeddings1)), l2_normalize(_array(embeddings2))
        return np.einsum("ij,ij->i", a, b).astype(np.float32)

    @property
    def mteb_model_meta(self) -> Any:
        """mteb.ModelMeta describing this model (needs mteb)."""
        if self._meta is None:
            try:
                from mteb.models.model_meta import ModelMeta
            except ImportError:
                raise ImportError("the MTEB adapter needs `pip install mteb` (extra: cqg-ray[mteb])") from None
            questions = getattr(self.model, "questions", None)
            self._meta = ModelMeta(
                loader=None, name=self.name, revision=self.revision, release_date=None, languages=["eng-Latn"],
                n_parameters=None, memory_usage_mb=None, max_tokens=None,
                embed_dim=len(questions) if questions is not None else None,
                license=None, open_weights=True, public_training_code=None, public_training_data=None,
                framework=["PyTorch"], similarity_fn_name="cosine", use_instructions=False, training_datasets=None,
            )
        return self._meta
