"""The training checkpoint: heads.safetensors (the model's own format), optimizer.pt (Adam's state), state.json.

The checkpoint is internal to a training run (resume, worker restarts); the model folder the train stage writes
holds safetensors only.
"""

from __future__ import annotations

import json
import os

import torch

from cqg_ray.mbqa.heads import StackedHeads


def save_checkpoint(folder: str, heads: StackedHeads, opt: torch.optim.Optimizer, epoch: int, extra: dict | None = None) -> None:
    """heads.safetensors + optimizer.pt (``torch.save`` of the optimizer's state dict) + state.json (epoch, extra)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "heads.safetensors"), "wb") as f:
        f.write(heads.to_bytes())
    torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"epoch": epoch, **(extra or {})}, f)


def load_checkpoint(folder: str, heads: StackedHeads | None = None, opt: torch.optim.Optimizer | None = None) -> tuple[StackedHeads, int]:
    """Restore heads (and the optimizer's moments and steps, when given) from a checkpoint folder; returns (heads,
    epochs done). The optimizer keeps its own settings (lr): only its state is read, with ``weights_only=True``."""
    loaded = StackedHeads.load(os.path.join(folder, "heads.safetensors"))
    if heads is None:
        heads = loaded
    else:
        heads.load_state_dict(loaded.state_dict())
    if opt is not None:
        state = torch.load(os.path.join(folder, "optimizer.pt"), map_location="cpu", weights_only=True)["state"]
        opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
    with open(os.path.join(folder, "state.json")) as f:
        epoch = int(json.load(f)["epoch"])
    return heads, epoch
