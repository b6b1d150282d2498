"""Training the MBQA heads on the stored, frozen embeddings with Ray (paper section 3.2, Appendix B).

The data is a Ray Dataset of labelled texts (`mbqa.train_data`: a row per text, its embedding and its pairs); the loop
itself is `mbqa.loop.run_epochs`, the same with or without Ray, and `train_worker` is one worker's run of it. Two
trainers (`train.trainer`): Ray Train's `TorchTrainer` runs it on `num_workers` data-parallel workers (DDP), each
reading its shard through ``get_dataset_shard`` (`TextSplit`: the whole dataset, in block order, no rows dropped);
shards differ in size, so the workers agree on the steps of an epoch (the fullest shard's, an all-reduce max) and on
pos_weight (sums of the shards' answers). The task trainer runs the one worker in one Ray task, without Train's
controller and worker group (their start is most of a small run's time). Every `checkpoint_every` epochs a checkpoint
is written (`mbqa.checkpoint`; under Ray Train rank 0 reports it with `ray.train.report`, the only reports: metrics go
to the log every epoch); a worker failure restarts from it (`max_failures`), and calling `fit_heads` again with the
same storage_path and name after a kill resumes from it. One log line per epoch (loss, pairs/s), and a progress bar
on the driver fed through a Ray queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass

import numpy as np
import torch
from ray.train import DataConfig

from cqg_ray.config import TrainConfig
from cqg_ray.log import setup_logging
from cqg_ray.mbqa.checkpoint import (CHECKPOINT, checkpoints, latest_checkpoint, load_checkpoint, local_checkpoint,
                                     newest_whole_checkpoint, save_checkpoint, write_checkpoint)
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.loop import make_optimizer, run_epochs, steps_per_epoch
from cqg_ray.mbqa.pairs import LabelPairs, split_holdout
from cqg_ray.mbqa.prior import PriorHeads, fit_prior, fold_prior, pair_cosines, unit_rows
from cqg_ray.mbqa.train_data import arrays_dataset, shard_arrays, worker_cpus
from cqg_ray.rundir import RunDir, resolve

log = logging.getLogger("cqg_ray")


def train_worker(config: dict, shard: dict, resume, report, rank: int = 0, world: int = 1, device="cpu", all_reduce=None, wrap=None) -> None:
    """One worker's training on its shard (`shard_arrays`), the same under Ray Train and in one task.

    The workers agree on the steps of an epoch (the fullest shard's) and on pos_weight through ``all_reduce`` (none: one
    worker). ``resume(heads, opt)`` loads the latest checkpoint into them and returns its epoch (0: none);
    ``report(metrics, state)`` is called every `checkpoint_every` epochs and at the end with ``state`` = (heads, opt,
    epochs done) to checkpoint, and once with ``state`` None when a finished run is started again (with the state when
    it resumed from ``config["resume_from"]``, a checkpoint Train does not know of). ``wrap``: the model that is called
    (DDP's wrapper of the heads)."""
    cfg = TrainConfig(**config["cfg"])
    reduce = all_reduce or (lambda t, op="sum": t)
    # every rank runs the steps of the fullest shard (ranks with unequal step counts would hang in DDP's all-reduce)
    n_steps = int(reduce(torch.tensor([steps_per_epoch([shard], config["m"], cfg.pairs_per_head)]), "max")[0])
    pairs, yes = (int(v) for v in reduce(torch.tensor([len(shard["label"]), int(shard["label"].sum())], dtype=torch.int64)))
    if pairs == 0:
        raise ValueError("no labelled pairs to train on")
    pos_weight = ((pairs - yes) / yes if yes else 1.0) if cfg.pos_weight == "auto" else float(cfg.pos_weight)
    if rank == 0:
        log.info("train: %d pairs over %d workers (this one %d texts, %d pairs), pos_weight=%.4f, %d steps/epoch, %d epochs",
                 pairs, world, shard["texts"], len(shard["label"]), pos_weight, n_steps, cfg.epochs)

    prior = {}
    if config.get("prior") is not None:  # the question prior: fixed while the heads train (`mbqa.prior`)
        cos = pair_cosines(shard["emb"], shard["row"], shard["question"], config["prior"])
        alpha, beta = fit_prior(cos, shard["answer"], all_reduce=lambda t: reduce(t))
        prior = {"prior_alpha": alpha, "prior_beta": beta}
        if rank == 0:
            log.info("train: question prior P(yes) = sigma(%.3f * cos(text, question) %+.3f), fitted on the %d training pairs", alpha, beta, pairs)

    torch.manual_seed(cfg.seed)
    heads = StackedHeads(config["d"], config["m"], cfg.hidden).to(device)
    opt = make_optimizer(heads, cfg)
    start_epoch = resume(heads, opt)
    if start_epoch and rank == 0:
        log.info("train: resuming from the checkpoint after epoch %d", start_epoch)
    if rank == 0 and config["progress"] is not None:
        config["progress"].put({"epoch": start_epoch})  # the bar starts where the run does, 0 or a resumed epoch
    if start_epoch >= cfg.epochs:  # a finished run started again: nothing left to train
        again = (heads, opt, start_epoch) if config.get("resume_from") else None
        report({"epoch": start_epoch, "start_epoch": start_epoch, "pos_weight": pos_weight, **prior}, again)
        return

    def on_epoch_end(epoch: int, metrics: dict) -> None:
        metrics.update(pos_weight=pos_weight, shard_pairs=len(shard["label"]), **prior)  # shard_pairs: rank 0's (the one reported)
        if rank == 0:
            log.info("train: epoch %d/%d loss %.4f pairs %d %.0f pairs/s %.1fs", metrics["epoch"], cfg.epochs,
                     metrics["loss"], metrics["pairs"], metrics["pairs_per_s"], metrics["seconds"])
            if config["progress"] is not None:
                config["progress"].put({k: metrics[k] for k in ("epoch", "loss")})
        if (epoch + 1) % cfg.checkpoint_every == 0 or epoch + 1 == cfg.epochs:
            report(metrics, (heads, opt, epoch + 1))
        # no report between checkpoints: each ray.train.report is a barrier with the controller (about 2 s on
        # this Ray), which made small runs (milliseconds an epoch) spend nearly all their time reporting

    model = wrap(heads) if wrap else heads
    if prior:
        model = PriorHeads(model, config["prior"], prior["prior_alpha"], prior["prior_beta"]).to(device)
    run_epochs(heads, opt, shard, n_steps, cfg, pos_weight, start_epoch, on_epoch_end,
               model=model, device=device, rank=rank, all_reduce=all_reduce)


def _train_loop_per_worker(config: dict) -> None:
    """A Ray Train worker: its shard through ``get_dataset_shard``, DDP between workers, checkpoints through
    ``ray.train.report``."""
    import ray
    import ray.train
    import ray.train.torch

    setup_logging()
    torch.set_num_threads(max(1, int(config["cpus"])))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    shard = shard_arrays(ray.train.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="pyarrow"), config["d"])

    def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if world == 1:
            return t
        import torch.distributed as dist

        t = t.to(device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.cpu()

    def resume(heads, opt) -> int:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None and config.get("resume_from"):  # Train lost its snapshot (`checkpoint_without_snapshot`)
            with local_checkpoint(config["resume_from"]) as folder:
                return load_checkpoint(folder, heads, opt)[1]
        if checkpoint is None:
            return 0
        with checkpoint.as_directory() as folder:
            return load_checkpoint(folder, heads, opt)[1]

    def report(metrics: dict, state) -> None:
        if state is None:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:
                save_checkpoint(tmp, *state, {k: metrics[k] for k in ("loss",) if k in metrics})  # none: a finished run checkpointed again
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
            else:
                ray.train.report(metrics, checkpoint=None)

    train_worker(config, shard, resume, report, rank, world, device, all_reduce,
                 wrap=ray.train.torch.prepare_model if world > 1 else None)


def _train_task(config: dict, texts, folder: str) -> dict:
    """The task trainer: one Ray task reads the whole dataset and runs the loop, checkpointing into ``folder`` (a
    path or URI; `checkpoint.write_checkpoint`) and resuming from its latest checkpoint. Returns the last metrics."""
    setup_logging()
    torch.set_num_threads(max(1, int(config["cpus"])))
    device = "cuda" if config["cfg"]["use_gpu"] and torch.cuda.is_available() else "cpu"
    shard = shard_arrays(texts.iter_batches(batch_size=None, batch_format="pyarrow"), config["d"])
    out: dict = {}

    def resume(heads, opt) -> int:
        with latest_checkpoint(folder) as found:
            return load_checkpoint(found, heads, opt)[1] if found else 0

    def report(metrics: dict, state) -> None:
        out.update(metrics)
        if state is not None:
            write_checkpoint(folder, *state, {"loss": metrics["loss"]})

    train_worker(config, shard, resume, report, device=device)
    return out


class EpochBar:
    """The driver's progress view (a bar, or a log line every 25 s; ``_progress.json`` in ``run``) of the epochs rank 0
    puts in a Ray queue while `trainer.fit()` blocks: the epoch it starts at (0, or the checkpoint's when resuming),
    then each epoch as it ends."""

    def __init__(self, epochs: int, run=None):
        self.epochs, self.run = epochs, run
        self.shown: list[int] = []  # the epoch counts the bar has shown, in order
        self.queue = None
        if os.environ.get("CQG_RAY_PROGRESS", "1") != "0":
            from ray.util.queue import Queue

            self.queue = Queue(actor_options={"num_cpus": 0})

    def __enter__(self):
        if self.queue is not None:
            from cqg_ray import progress

            self.view = progress.View("train", "epoch", self.epochs, kind="epochs", run=self.run, stage="train").__enter__()
            self.thread = threading.Thread(target=self._follow, daemon=True)
            self.thread.start()
        return self

    def _follow(self) -> None:
        from cqg_ray import progress

        counted = None  # the epoch the counter stands at (None until the first message: where the run starts)
        for p in iter(self.queue.get, None):  # None: fit() returned
            n = min(int(p["epoch"]), self.epochs)
            if counted is None:
                self.view.initial, counted = n, n
            progress.add(epochs=n - counted)
            counted = n
            if "loss" in p:
                self.view.note = f"loss {p['loss']:.4f}"
            self.view.refresh()
            self.shown.append(n)

    def __exit__(self, *exc):
        if self.queue is not None:
            self.queue.put(None)
            self.thread.join()
            self.view.__exit__(*exc)
            self.queue.shutdown()
        return False


@dataclass
class TrainResult:
    heads: StackedHeads
    epochs: int  # epochs done in total (including those before a resume)
    metrics: dict  # the last reported epoch's metrics
    pos_weight: float
    checkpoint_path: str


class TextSplit(DataConfig):
    """Ray Train's dataset split without its truncation: ``streaming_split(equal=False)`` in the dataset's block order
    (Train's default, ``equal=True``, drops rows to make the shards equal). Shards may differ in size; the train loop
    runs the fullest shard's steps on every worker. With ``preserve_order`` the same texts go to the same worker on
    every run, so a restarted or resumed run trains on the same shards."""

    def configure(self, datasets, world_size, worker_handles=None, worker_node_ids=None, **kwargs):
        from ray.data import ExecutionOptions

        output = [{} for _ in range(world_size)]
        for name, ds in datasets.items():
            ds = ds.copy(ds)
            ds.context.execution_options = ExecutionOptions(preserve_order=True)
            for i, split in enumerate(ds.streaming_split(world_size, equal=False)):
                output[i][name] = split
        return output


@contextlib.contextmanager
def sigint_kept():
    """Inside the block, the SIGINT handler may change (Ray Train's ``fit()`` in the main thread installs one that aborts
    its run); after it the one before is back. Train's handler holds its controller's handle, so left installed it
    kept the controller actor (and the Data actors it owns) alive for as long as the driver lived, and a later Ctrl-C
    went to that finished run instead of raising KeyboardInterrupt."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if main and before is not None:
            signal.signal(signal.SIGINT, before)


def trainer_kind(cfg: TrainConfig) -> str:
    """The trainer `fit_heads` uses: ``train.trainer``, where ``auto`` is one task for one worker, Ray Train for more
    (``task`` with more workers is refused by `TrainConfig`)."""
    return cfg.trainer if cfg.trainer != "auto" else ("task" if cfg.num_workers == 1 else "ray")


SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of a run's checkpoints, in the run's folder


def checkpoint_without_snapshot(folder: str) -> str | None:
    """The checkpoint a Ray Train run in ``folder`` must resume from that Train itself would not find, or None.

    Train resumes from its snapshot (`SNAPSHOT`), which it rewrites in place after each checkpoint: a kill in that
    moment leaves it empty or cut, and the next ``fit()`` fails on it; a kill before the first snapshot of a restarted
    run leaves none. Then the newest checkpoint that loads is returned and an unreadable snapshot deleted (it holds
    nothing), so that Train starts clean and the loop resumes from that checkpoint."""
    run = RunDir(folder)
    if run.exists(SNAPSHOT):
        try:
            json.loads(run.read_bytes(SNAPSHOT).decode("utf-8"))
            return None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            log.warning("train: Ray Train's snapshot %s does not read (%s: %s), as a kill while it was rewritten leaves it; "
                        "deleting it", run.uri(SNAPSHOT), type(e).__name__, e)
            run.rm(SNAPSHOT)
    newest = newest_whole_checkpoint(folder)
    if newest is None:
        return None
    log.warning("train: resuming from %s (epoch %d), the newest checkpoint that loads, without Train's snapshot", *newest)
    return newest[0]


def drop_checkpoints_train_forgot(folder: str, before: list[str]) -> None:
    """After a run that `checkpoint_without_snapshot` resumed has finished: delete the checkpoint folders of ``before``
    (those in ``folder`` when it started) that Train's new snapshot does not name. Train's ``num_to_keep`` counts only
    the checkpoints it knows of, so these would otherwise stay in storage for good."""
    run = RunDir(folder)
    try:
        named = {r["checkpoint_dir_name"] for r in json.loads(run.read_bytes(SNAPSHOT).decode("utf-8"))["checkpoint_results"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("train: Ray Train's snapshot %s does not read after the run (%s: %s); its older checkpoints are kept",
                    run.uri(SNAPSHOT), type(e).__name__, e)
        return
    for name in before:
        if name not in named:
            run.rm(name)


def fit_heads(texts, d: int, m: int, cfg: TrainConfig, storage_path: str, name: str, run=None, q_vectors=None) -> TrainResult:
    """Train m stacked heads on a Ray Dataset of labelled texts (`train_data.TEXT_COLUMNS`).

    Every row given is trained on (filter the held-out texts out first). ``train.trainer`` (`trainer_kind`): Ray
    Train's ``TorchTrainer`` on ``num_workers`` data-parallel workers, each reading its shard through
    ``get_dataset_shard``; or one Ray task running the same loop on the whole dataset (no Train controller or worker
    group to start: ~30 s less per run on 2 cores). Either asks for ``cpus_per_worker`` CPUs a worker, fewer when that
    would leave Ray Data less than ``train.data_cpus`` of the cluster. A run with the same storage_path and name resumes
    from its last checkpoint; a worker that dies is restarted from it (`cfg.max_failures` times). ``run``: the run
    directory whose ``_progress.json`` follows the epochs. ``q_vectors`` (m, d): the questions' embeddings, for the
    question prior (`mbqa.prior`): the heads train beside it and come back with it folded in (hidden + 2 units).
    """
    import ray

    cpus = worker_cpus(cfg.cpus_per_worker, cfg.num_workers, ray.cluster_resources().get("CPU", 0.0), cfg.data_cpus)
    if cpus < cfg.cpus_per_worker:
        log.info("train: %d worker(s) at %.2f CPUs each (train.cpus_per_worker %.2f), keeping %.2f CPUs for Ray Data",
                 cfg.num_workers, cpus, cfg.cpus_per_worker, cfg.data_cpus)
    bar = EpochBar(cfg.epochs, run)
    config = {"cfg": cfg.model_dump(mode="json"), "d": int(d), "m": int(m), "cpus": cpus, "progress": bar.queue,
              "prior": None if q_vectors is None else unit_rows(q_vectors)}
    folder = f"{storage_path.rstrip('/')}/{name}"
    if trainer_kind(cfg) == "task":
        ordered = texts.copy(texts)  # the block order of a Train split (`TextSplit`)
        from ray.data import ExecutionOptions

        ordered.context.execution_options = ExecutionOptions(preserve_order=True)
        task = ray.remote(_train_task).options(num_cpus=cpus, num_gpus=1 if cfg.use_gpu else 0, max_retries=cfg.max_failures,
                                               name=f"train {name}")
        with bar:
            metrics = ray.get(task.remote(config, ordered, folder))
        with latest_checkpoint(folder) as found:
            if found is None:
                raise RuntimeError(f"training run {name} in {storage_path} finished without a checkpoint")
            heads, epochs = load_checkpoint(found)
        return TrainResult(with_prior(heads, config["prior"], metrics), epochs, metrics, float(metrics.get("pos_weight", 1.0)),
                           f"{folder}/{CHECKPOINT}{epochs:06d}")

    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config["resume_from"] = checkpoint_without_snapshot(folder)
    before = checkpoints(*resolve(folder)) if config["resume_from"] else []  # Train will not know of these

    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(storage_path=storage_path, name=name,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
        datasets={"train": texts},
        dataset_config=TextSplit(),
    )
    with bar, sigint_kept():
        result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {name} in {storage_path} finished without a checkpoint")
    with result.checkpoint.as_directory() as local:
        heads, epochs = load_checkpoint(local)
    if before:
        drop_checkpoints_train_forgot(folder, before)
    metrics = dict(result.metrics or {})
    return TrainResult(with_prior(heads, config["prior"], metrics), epochs, metrics, float(metrics.get("pos_weight", 1.0)),
                       result.checkpoint.path)


def with_prior(heads: StackedHeads, q_vectors, metrics: dict) -> StackedHeads:
    """The trained heads with the question prior the workers fitted (``metrics``) folded in; as they are without one."""
    if q_vectors is None:
        return heads
    if "prior_alpha" not in metrics:
        raise RuntimeError("train: the workers reported no question prior (prior_alpha, prior_beta) to fold into the heads")
    return fold_prior(heads, q_vectors, metrics["prior_alpha"], metrics["prior_beta"])


def train_heads(
    embeddings: np.ndarray,
    labels: LabelPairs | np.ndarray,
    cfg: TrainConfig,
    storage_path: str,
    name: str,
    q_vectors: np.ndarray | None = None,
) -> TrainResult:
    """Train m stacked heads on the frozen embeddings of the labelled texts with Ray Train (`fit_heads`; ``q_vectors``:
    the questions' embeddings for the question prior).

    embeddings: (n_docs, d) float (rows indexed by `labels.doc`); labels: `LabelPairs`, or a dense (n_docs, m)
    int8 matrix with -1 for unlabelled. Every labelled pair given is trained on (split the held-out documents off
    first: `train_and_evaluate`). The arrays become a Ray Dataset of text rows (`train_data.arrays_dataset`).
    """
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
    log.info("train: %d pairs, %d questions, %d texts, d=%d, %d workers, %d epochs", len(pairs), pairs.n_questions,
             len(np.unique(pairs.doc)), embeddings.shape[1], cfg.num_workers, cfg.epochs)
    return fit_heads(arrays_dataset(embeddings, pairs), embeddings.shape[1], pairs.n_questions, cfg, storage_path, name, q_vectors=q_vectors)


def train_and_evaluate(
    embeddings: np.ndarray,
    labels: LabelPairs | np.ndarray,
    cfg: TrainConfig,
    storage_path: str,
    name: str,
    q_vectors: np.ndarray | None = None,
) -> tuple[TrainResult, dict]:
    """Hold out `cfg.holdout` of the labelled documents (by document), train on the rest, evaluate on them.

    Returns (TrainResult, report) where report is the Table 6 report on the held-out pairs plus split counts.
    """
    pairs = labels if isinstance(labels, LabelPairs) else LabelPairs.from_dense(labels)
    train, test = split_holdout(pairs, cfg.holdout, cfg.seed)
    result = train_heads(embeddings, train, cfg, storage_path, name, q_vectors=q_vectors)
    from cqg_ray.mbqa.report import evaluate_heads  # sklearn: the driver's, kept out of every Train worker's start

    report = evaluate_heads(result.heads, embeddings, test, cfg.tau) if len(test) else {}
    report["split"] = {"train_docs": int(len(np.unique(train.doc))), "heldout_docs": int(len(np.unique(test.doc))),
                       "train_pairs": len(train), "heldout_pairs": len(test),
                       "pos_weight": result.pos_weight, "epochs": result.epochs}
    return result, report

