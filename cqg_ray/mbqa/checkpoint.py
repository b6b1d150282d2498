"""The training checkpoint: heads.safetensors (the model's own format), optimizer.pt (Adam's state), state.json.

The checkpoint is internal to a training run (resume, worker restarts; the task trainer keeps its own under its run
folder: `write_checkpoint`, `latest_checkpoint`); the model folder the train stage writes
holds safetensors only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import torch

from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.rundir import resolve

log = logging.getLogger("cqg_ray")


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


CHECKPOINT = "checkpoint_"  # + the epochs done, 6 digits: the task trainer's checkpoint folders under its run folder
KEEP = 2  # checkpoints kept (the newest)


def write_checkpoint(folder: str, heads: StackedHeads, opt: torch.optim.Optimizer, epoch: int, extra: dict | None = None) -> str:
    """`save_checkpoint` into ``folder``/checkpoint_<epoch> (a path or a pyarrow URI), whole or not at all (written
    beside, then moved), keeping the newest `KEEP`. Returns the checkpoint's path."""
    import tempfile

    from pyarrow import fs as pafs

    fs, root = resolve(folder)
    fs.create_dir(root, recursive=True)
    name = f"{CHECKPOINT}{epoch:06d}"
    partial = f"{root}/.{name}.partial"
    fs.delete_dir_contents(partial, missing_dir_ok=True)
    if isinstance(fs, pafs.LocalFileSystem):
        save_checkpoint(partial, heads, opt, epoch, extra)
    else:
        fs.create_dir(partial, recursive=True)
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(tmp, heads, opt, epoch, extra)
            pafs.copy_files(tmp, partial, destination_filesystem=fs)
    fs.delete_dir_contents(f"{root}/{name}", missing_dir_ok=True)
    fs.move(partial, f"{root}/{name}")
    for old in checkpoints(fs, root)[:-KEEP]:
        fs.delete_dir(f"{root}/{old}")
    return f"{folder.rstrip('/')}/{name}"


def checkpoints(fs, root: str) -> list[str]:
    """The names of the whole checkpoints under ``root``, oldest first."""
    from pyarrow import fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith(CHECKPOINT))


@contextlib.contextmanager
def local_checkpoint(path: str):
    """A checkpoint folder (a path or a pyarrow URI) as a local folder: itself, or a copy made for the block."""
    with _local(*resolve(path)) as folder:
        yield folder


@contextlib.contextmanager
def _local(fs, path: str):
    import tempfile

    from pyarrow import fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        yield path
    else:
        with tempfile.TemporaryDirectory() as tmp:
            pafs.copy_files(path, tmp, source_filesystem=fs)
            yield tmp


@contextlib.contextmanager
def latest_checkpoint(folder: str):
    """The newest checkpoint under ``folder`` as a local folder (copied down from a remote URI), or None."""
    fs, root = resolve(folder)
    names = checkpoints(fs, root)
    if not names:
        yield None
    else:
        with _local(fs, f"{root}/{names[-1]}") as found:
            yield found


def newest_whole_checkpoint(folder: str) -> tuple[str, int] | None:
    """The newest checkpoint under ``folder`` whose files all load (`load_checkpoint`), as (its path or URI, its epoch), or None.
    A folder a kill left half-copied (Ray Train copies its checkpoints into storage file by file) is passed over."""
    fs, root = resolve(folder)
    for name in reversed(checkpoints(fs, root)):
        try:
            with _local(fs, f"{root}/{name}") as local:
                torch.load(os.path.join(local, "optimizer.pt"), map_location="cpu", weights_only=True)
                return f"{folder.rstrip('/')}/{name}", load_checkpoint(local)[1]
        except Exception as e:  # a missing or cut file: OSError, JSON, safetensors' or torch.load's own errors
            log.warning("checkpoint %s/%s does not load (%s: %s): passed over", folder.rstrip("/"), name, type(e).__name__, e)
    return None
