"""cqg-ray: interpretable semantic text embeddings (CQG-MBQA) at cluster scale on Ray.

    from cqg_ray import InterpretableEmbedder
    model = InterpretableEmbedder.load("runs/demo/model")
    bits = model.encode(["a text", "another"])          # output="bits" | "packed" | "probs" | "sparse"
    model.explain("text a", "text b")
"""

__version__ = "0.1.0"

__all__ = ["InterpretableEmbedder", "__version__"]


def __getattr__(name):  # lazy: importing the package must not import torch
    if name == "InterpretableEmbedder":
        from cqg_ray.mbqa.embedder import InterpretableEmbedder

        return InterpretableEmbedder
    raise AttributeError(f"module 'cqg_ray' has no attribute {name!r}")


def __dir__():  # tab completion lists the lazy name too
    return sorted({*globals(), *__all__})
