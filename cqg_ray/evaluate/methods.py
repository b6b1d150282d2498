"""The rows of the tables: the interpretable models, the baselines, any Encoder; and their embeddings of a text set."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cqg_ray.evaluate.baselines import BM25, BagOfTokens, DenseEncoder
from cqg_ray.evaluate.metrics import l2_normalize
from cqg_ray.evaluate.models import budgeted, is_interpretable, load_model, model_name, probabilities

log = logging.getLogger("cqg_ray")


@dataclass
class Method:
    """One row of the tables."""

    name: str
    kind: str  # interpretable | dense | bag_of_tokens | encoder | bm25
    obj: Any

    @property
    def binary(self) -> bool:
        """Whether the cognitive load (dimensions nonzero in both texts) means something for this row."""
        if self.kind == "bag_of_tokens":
            return self.obj.weights == "binary"  # term counts: no cognitive load (Eq. 5 is for 0/1)
        return self.kind == "interpretable"

    def describe(self) -> dict:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "interpretable":
            b = getattr(self.obj, "budget", None)
            d.update(budget=b.to_dict() if b is not None else {"rule": "tau", "tau": float(self.obj.tau), "value": "one"},
                     dims=len(self.obj.questions))
        elif self.kind == "bag_of_tokens":
            d.update(dims=self.obj.dims, weights=self.obj.weights)
        elif self.kind == "bm25":
            d.update(self.obj.describe())
        return d


def embed_texts(methods: list[Method], texts: list[str]) -> dict[str, tuple[Any, np.ndarray | None, float]]:
    """Every method's embeddings of one text set: {name: (X, probabilities or None, seconds)}.

    Interpretable models give X = the vectors ``encode(output="sparse")`` returns (dense here: the budgeted values,
    zeros elsewhere), from probabilities computed once. The sentence encoder runs
    once per text set for everything that shares it: the dense baseline on a model's encoder and the model itself
    when it offers ``encode_embeddings`` (heads on precomputed embeddings, as ``InterpretableEmbedder`` does). The
    shared pass is timed with the first method that needs it.
    """
    raw: dict[int, np.ndarray] = {}

    def encoder_pass(enc: Any) -> np.ndarray:
        if id(enc) not in raw:
            raw[id(enc)] = DenseEncoder(enc).encode(texts)
        return raw[id(enc)]

    out = {}
    for m in methods:
        if m.kind == "bm25":
            continue
        t0 = time.time()
        probs = None
        if m.kind == "interpretable":
            if hasattr(m.obj, "encode_embeddings") and getattr(m.obj, "encoder", None) is not None:
                E = encoder_pass(m.obj.encoder)
                if getattr(m.obj, "normalize", False):
                    E = l2_normalize(E)
                probs = np.asarray(m.obj.encode_embeddings(E, output="probs"), dtype=np.float32)
            else:
                probs = probabilities(m.obj, texts)
            X = budgeted(m.obj, probs)
        elif m.kind == "dense":
            X = encoder_pass(m.obj.model)
        else:
            X = m.obj.encode(list(texts))
        out[m.name] = (X, probs, time.time() - t0)
    return out


def build_methods(
    models: dict[str, Any], baselines: list[str], tasks: list[str], bag_of_tokens_weights: str = "binary"
) -> list[Method]:
    """The models' rows, then the baselines asked for (the dense one on the first interpretable model's encoder)."""
    methods = []
    for name, obj in models.items():
        if is_interpretable(obj):
            methods.append(Method(name, "interpretable", obj))
        elif hasattr(obj, "encode"):
            methods.append(Method(name, "encoder", obj))
        else:
            raise TypeError(f"{name}: not a model (needs encode(texts)); got {type(obj).__name__}")
    primary = next((m.obj for m in methods if m.kind == "interpretable"), None)
    if "dense" in baselines:
        enc = getattr(primary, "encoder", None)
        if enc is None:
            log.warning("dense baseline skipped: no interpretable model with an .encoder")
        else:
            label = getattr(primary, "encoder_name", None)
            label = str(label).split(":")[-1].rstrip("/").rsplit("/", 1)[-1] if label else None
            methods.append(Method(f"Dense ({label})" if label else "Dense encoder", "dense", DenseEncoder(enc)))
    if "bag_of_tokens" in baselines:
        methods.append(Method("Bag-of-Tokens", "bag_of_tokens", BagOfTokens(weights=bag_of_tokens_weights)))
    if "bm25" in baselines and "retrieval" in tasks:
        methods.append(Method("BM25", "bm25", BM25()))
    return methods


def as_models(model_or_path: Any) -> dict[str, Any]:
    """{row name: model} from a model, a model folder, or a mapping of names to either (or to an Encoder)."""
    if isinstance(model_or_path, dict):
        return {name: load_model(m) for name, m in model_or_path.items()}
    model = load_model(model_or_path)
    return {model_name(model): model}
