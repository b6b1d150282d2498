"""Training the MBQA heads with Ray Train on the stored, frozen embeddings (paper section 3.2, Appendix B).

The data is `LabelPairs` (`mbqa.pairs`) over the encoder embeddings of the labelled texts; the loop itself is
`mbqa.loop.run_epochs`, the same with or without Ray. `TorchTrainer` runs it on `num_workers` data-parallel workers
(DDP). The driver splits the training texts over the workers (each worker's shard -- its texts' embeddings and their
pairs -- goes once into the object store), and every worker runs the same number of steps per epoch. Every
`checkpoint_every` epochs rank 0 writes a checkpoint (`mbqa.checkpoint`) and reports it with `ray.train.report` (the
only reports: metrics go to the log every epoch); a worker failure restarts from it (`FailureConfig(max_failures)`),
and calling `train_heads` again with the same storage_path and name after a kill resumes from it. One log line per
epoch (loss, pairs/s), and a progress bar on the driver fed through a Ray queue.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from dataclasses import dataclass

import numpy as np
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.log import setup_logging
from cqg_ray.mbqa.checkpoint import load_checkpoint, save_checkpoint
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.loop import make_optimizer, make_shards, run_epochs, steps_per_epoch
from cqg_ray.mbqa.pairs import LabelPairs, split_holdout
from cqg_ray.mbqa.report import evaluate_heads

log = logging.getLogger("cqg_ray")


def _train_loop_per_worker(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch

    setup_logging()
    cfg = TrainConfig(**config["cfg"])
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    shard = ray.get(config["shards"][rank])

    torch.manual_seed(cfg.seed)
    heads = StackedHeads(config["d"], config["m"], cfg.hidden).to(device)
    opt = make_optimizer(heads, cfg)
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            _, start_epoch = load_checkpoint(folder, heads, opt)
        if rank == 0:
            log.info("train: resuming from the checkpoint after epoch %d", start_epoch)
    if rank == 0 and config["progress"] is not None:
        config["progress"].put({"epoch": start_epoch})  # the bar starts where the run does, 0 or a resumed epoch
    if start_epoch >= cfg.epochs:  # a finished run started again: nothing left to train
        ray.train.report({"epoch": start_epoch, "start_epoch": start_epoch})
        return
    model = ray.train.torch.prepare_model(heads) if world > 1 else heads

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        if world == 1:
            return t
        import torch.distributed as dist

        t = t.to(device)
        dist.all_reduce(t)
        return t.cpu()

    def on_epoch_end(epoch: int, metrics: dict) -> None:
        if rank == 0:
            log.info("train: epoch %d/%d loss %.4f pairs %d %.0f pairs/s %.1fs", metrics["epoch"], cfg.epochs,
                     metrics["loss"], metrics["pairs"], metrics["pairs_per_s"], metrics["seconds"])
            if config["progress"] is not None:
                config["progress"].put({k: metrics[k] for k in ("epoch", "loss")})
        if (epoch + 1) % cfg.checkpoint_every == 0 or epoch + 1 == cfg.epochs:
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    save_checkpoint(tmp, heads, opt, epoch + 1, {"loss": metrics["loss"]})
                    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
                else:
                    ray.train.report(metrics, checkpoint=None)
        # no report between checkpoints: each ray.train.report is a barrier with the controller (about 2 s on
        # this Ray), which made small runs (milliseconds an epoch) spend nearly all their time reporting

    run_epochs(heads, opt, shard, config["n_steps"], cfg, config["pos_weight"], start_epoch, on_epoch_end,
               model=model, device=device, rank=rank, all_reduce=all_reduce)


class EpochBar:
    """A tqdm bar on the driver that follows the epochs rank 0 puts in a Ray queue while `trainer.fit()` blocks: the
    epoch it starts at (0, or the checkpoint's when resuming), then each epoch as it ends."""

    def __init__(self, epochs: int):
        self.epochs = epochs
        self.shown: list[int] = []  # the epoch counts the bar has shown, in order
        self.queue = None
        if os.environ.get("CQG_RAY_PROGRESS", "1") != "0":
            from ray.util.queue import Queue

            self.queue = Queue(actor_options={"num_cpus": 0})

    def __enter__(self):
        if self.queue is not None:
            self.thread = threading.Thread(target=self._follow, daemon=True)
            self.thread.start()
        return self

    def _follow(self) -> None:
        from tqdm.auto import tqdm

        with tqdm(total=self.epochs, desc="train", unit="epoch") as bar:
            for p in iter(self.queue.get, None):  # None: fit() returned
                bar.n = min(int(p["epoch"]), self.epochs)
                if "loss" in p:
                    bar.set_postfix(loss=f"{p['loss']:.4f}", refresh=False)
                bar.refresh()
                self.shown.append(bar.n)

    def __exit__(self, *exc):
        if self.queue is not None:
            self.queue.put(None)
            self.thread.join()
            self.queue.shutdown()
        return False


@dataclass
class TrainResult:
    heads: StackedHeads
    epochs: int  # epochs done in total (including those before a resume)
    metrics: dict  # the last reported epoch's metrics
    pos_weight: float
    checkpoint_path: str


def train_heads(
    embeddings: np.ndarray,
    labels: LabelPairs | np.ndarray,
    cfg: TrainConfig,
    storage_path: str,
    name: str,
) -> TrainResult:
    """Train m stacked heads on the frozen embeddings of the labelled texts with Ray Train.

    embeddings: (n_docs, d) float (rows indexed by `labels.doc`); labels: `LabelPairs`, or a dense (n_docs, m)
    int8 matrix with -1 for unlabelled. Every labelled pair given is trained on (split the held-out documents off
    first: `train_and_evaluate`). A run with the same storage_path and name resumes from its last checkpoint; a
    worker that dies is restarted from it (`cfg.max_failures` times).
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    pairs = labels if isinstance(labels, LabelPairs) else LabelPairs.from_dense(labels)
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be (n_docs, d), got shape {embeddings.shape}")
    if len(pairs) == 0:
        raise ValueError("no labelled pairs to train on")
    if pairs.doc.max() >= len(embeddings):
        raise ValueError(f"labels name text row {pairs.doc.max()} but there are only {len(embeddings)} embeddings")
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")
    key = pairs.doc * pairs.n_questions + pairs.question
    if len(np.unique(key)) != len(key):
        raise ValueError("duplicate (text, question) pairs in the labels: keep one answer per pair")
    pos_weight = pairs.auto_pos_weight() if cfg.pos_weight == "auto" else float(cfg.pos_weight)

    shards = make_shards(pairs, cfg.num_workers, cfg.seed)
    n_steps = steps_per_epoch(shards, pairs.n_questions, cfg.pairs_per_head)
    refs = []
    for s in shards:
        s = dict(s, emb=np.ascontiguousarray(embeddings[s.pop("docs")]))
        refs.append(ray.put(s))
    log.info("train: %d pairs, %d questions, %d texts, d=%d, pos_weight=%.4f, %d workers, %d steps/epoch, %d epochs",
             len(pairs), pairs.n_questions, len(np.unique(pairs.doc)), embeddings.shape[1], pos_weight,
             cfg.num_workers, n_steps, cfg.epochs)
    bar = EpochBar(cfg.epochs)
    config = {"cfg": cfg.model_dump(mode="json"), "shards": refs, "d": int(embeddings.shape[1]), "m": pairs.n_questions,
              "n_steps": n_steps, "pos_weight": pos_weight, "progress": bar.queue}
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(storage_path=storage_path, name=name,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    with bar:
        result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {name} in {storage_path} finished without a checkpoint")
    with result.checkpoint.as_directory() as folder:
        heads, epochs = load_checkpoint(folder)
    return TrainResult(heads, epochs, dict(result.metrics or {}), pos_weight, result.checkpoint.path)


def train_and_evaluate(
    embeddings: np.ndarray,
    labels: LabelPairs | np.ndarray,
    cfg: TrainConfig,
    storage_path: str,
    name: str,
) -> tuple[TrainResult, dict]:
    """Hold out `cfg.holdout` of the labelled documents (by document), train on the rest, evaluate on them.

    Returns (TrainResult, report) where report is the Table 6 report on the held-out pairs plus split counts.
    """
    pairs = labels if isinstance(labels, LabelPairs) else LabelPairs.from_dense(labels)
    train, test = split_holdout(pairs, cfg.holdout, cfg.seed)
    result = train_heads(embeddings, train, cfg, storage_path, name)
    report = evaluate_heads(result.heads, embeddings, test, cfg.tau) if len(test) else {}
    report["split"] = {"train_docs": int(len(np.unique(train.doc))), "heldout_docs": int(len(np.unique(test.doc))),
                       "train_pairs": len(train), "heldout_pairs": len(test),
                       "pos_weight": result.pos_weight, "epochs": result.epochs}
    return result, report

