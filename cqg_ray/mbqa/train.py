"""Training the MBQA heads with Ray Train on the stored, frozen embeddings (paper section 3.2, Appendix B).

The training data is a set of labelled pairs (text row, question, answer) -- `LabelPairs` -- over the encoder
embeddings of the labelled texts. Labels are kept sparse (three flat arrays, 13 bytes a pair): the paper's data is
10,000 questions x 1,000 texts = 10 M pairs spread over millions of texts, so a dense (n_docs, m) matrix would be
~99.96% empty (1 M docs x 10k questions = 10 GB of int8), while the pairs take 130 MB.

Steps are question-major: each step gives every head C_i the next K = `pairs_per_head` of its own labelled texts
(shuffled each epoch), computed as one batched matmul (m, K, d) x (m, d, hidden) -- see `StackedHeads.forward_grouped`.
The cost of a step is proportional to the labelled pairs, not to texts x m as in the paper's per-text steps (where
all m heads run on every text although ~4 of them have an answer). The loss is the paper's weighted BCE over the
labelled pairs only, pos_weight = #no / #yes (`masked_bce`); Adam with lr alpha = 1e-4.

Ray shell: `TorchTrainer` with `num_workers` data-parallel workers (DDP). The driver splits the training texts over
the workers (each worker's shard -- its texts' embeddings and their pairs -- goes once into the object store), and
every worker runs the same number of steps per epoch. Every `checkpoint_every` epochs rank 0 writes a checkpoint
(heads + Adam state in safetensors, epoch in JSON) and reports it with `ray.train.report` (the only reports:
metrics go to the log every epoch); a worker failure restarts
from it (`FailureConfig(max_failures)`), and calling `train_heads` again with the same storage_path and name after a
kill resumes from it. One log line per epoch (loss, pairs/s).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.log import setup_logging
from cqg_ray.mbqa.heads import StackedHeads, masked_bce
from cqg_ray.mbqa.plan import holdout_docs
from cqg_ray.mbqa.report import classification_report

log = logging.getLogger("cqg_ray")


# --------------------------------------------------------------------------------------------- labels


@dataclass
class LabelPairs:
    """Sparse labels: pair p says text row `doc[p]` answers question `question[p]` with `answer[p]` (1 yes, 0 no)."""

    doc: np.ndarray  # int64 (n,)
    question: np.ndarray  # int32 (n,)
    answer: np.ndarray  # int8 (n,)
    n_questions: int
    target: np.ndarray | None = None  # float32 (n,) soft training targets in [0, 1] (P(yes)); None = the hard answers

    def __post_init__(self):
        self.doc = np.asarray(self.doc, dtype=np.int64)
        self.question = np.asarray(self.question, dtype=np.int32)
        self.answer = np.asarray(self.answer, dtype=np.int8)
        if not (len(self.doc) == len(self.question) == len(self.answer)):
            raise ValueError("doc, question and answer must have the same length")
        if self.target is not None:
            self.target = np.asarray(self.target, dtype=np.float32)
            if len(self.target) != len(self.doc) or not np.all((self.target >= 0) & (self.target <= 1)):
                raise ValueError("soft targets must be one probability in [0, 1] per pair")
        if len(self.doc) and (self.question.min() < 0 or self.question.max() >= self.n_questions):
            raise ValueError(f"question indices must lie in [0, {self.n_questions})")
        if len(self.doc) and self.doc.min() < 0:
            raise ValueError("doc indices must be >= 0")
        if not np.isin(self.answer, (0, 1)).all():
            raise ValueError("answers must be 0 (no) or 1 (yes)")

    def __len__(self) -> int:
        return len(self.doc)

    @classmethod
    def from_dense(cls, labels: np.ndarray) -> "LabelPairs":
        """From a dense (n_docs, m) int8 matrix with 1 yes, 0 no, -1 unlabelled."""
        labels = np.asarray(labels)
        if labels.ndim != 2:
            raise ValueError(f"dense labels must be (n_docs, m), got shape {labels.shape}")
        doc, question = np.nonzero(labels >= 0)
        return cls(doc, question, labels[doc, question], labels.shape[1])

    def to_dense(self, n_docs: int) -> np.ndarray:
        out = np.full((n_docs, self.n_questions), -1, dtype=np.int8)
        out[self.doc, self.question] = self.answer
        return out

    def select(self, keep: np.ndarray) -> "LabelPairs":
        return LabelPairs(self.doc[keep], self.question[keep], self.answer[keep], self.n_questions,
                          None if self.target is None else self.target[keep])

    @property
    def training_target(self) -> np.ndarray:
        """What the heads are fitted to: the soft targets when present, else the hard answers (float32)."""
        return self.answer.astype(np.float32) if self.target is None else self.target

    def auto_pos_weight(self) -> float:
        """#no / #yes (the paper's weighting); 1.0 when there is no yes at all."""
        yes = int(self.answer.sum())
        return (len(self) - yes) / yes if yes else 1.0


# --------------------------------------------------------------------------------------------- pure core


def make_shards(pairs: LabelPairs, num_workers: int, seed: int = 0) -> list[dict]:
    """Split the labelled texts over workers (a seeded permutation of the texts dealt round-robin).

    Each shard: `docs` (global text rows, in local-row order), and its pairs as `row` (local row), `question`, `answer`
    (the training target: hard 0/1, or P(yes) with soft labels).
    """
    docs = np.unique(pairs.doc)
    owner = np.empty(len(docs), dtype=np.int64)
    owner[np.random.default_rng([seed, 0x5348]).permutation(len(docs))] = np.arange(len(docs)) % num_workers
    pair_owner = owner[np.searchsorted(docs, pairs.doc)]
    shards = []
    for w in range(num_workers):
        mine = docs[owner == w]
        keep = pair_owner == w
        shards.append({"docs": mine, "row": np.searchsorted(mine, pairs.doc[keep]).astype(np.int64),
                       "question": pairs.question[keep], "answer": pairs.training_target[keep]})
    return shards


def steps_per_epoch(shards: list[dict], n_questions: int, pairs_per_head: int) -> int:
    """Steps that cover every pair of every shard once (the same for all workers, so DDP stays in step)."""
    most = max((int(np.bincount(s["question"], minlength=n_questions).max()) if len(s["question"]) else 0) for s in shards)
    return max(1, math.ceil(most / pairs_per_head))


def epoch_layout(question: np.ndarray, pairs_per_head: int, seed: int, epoch: int, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Question-major step layout of one epoch: each question's pairs shuffled, the i-th K-block going to step i.

    Returns (order, step, slot): pair order[j] goes to step step[j] in slot slot[j] of its question; `order` is sorted
    by step so step s is a contiguous block.
    """
    n = len(question)
    rng = np.random.default_rng([seed, epoch, rank])
    by_q = np.lexsort((rng.random(n), question))
    q_sorted = question[by_q]
    start = np.searchsorted(q_sorted, q_sorted, side="left")
    pos = np.arange(n) - start
    step = pos // pairs_per_head
    by_step = np.argsort(step, kind="stable")
    return by_q[by_step], step[by_step], (pos % pairs_per_head)[by_step]


def run_epochs(
    heads: StackedHeads,
    opt: torch.optim.Optimizer,
    shard: dict,
    n_steps: int,
    cfg: TrainConfig,
    pos_weight: float,
    start_epoch: int,
    on_epoch_end: Callable[[int, dict], None],
    model: torch.nn.Module | None = None,
    device: torch.device | str = "cpu",
    rank: int = 0,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """The training loop (no Ray): epochs start_epoch..cfg.epochs-1 of question-major steps over one shard.

    `model` is what is called (the DDP wrapper when data-parallel; default: `heads`); `all_reduce` sums the
    epoch's loss statistics over workers. `on_epoch_end(epoch, metrics)` is called after every epoch.
    """
    model = model if model is not None else heads
    m, K = heads.m, cfg.pairs_per_head
    with warnings.catch_warnings():  # shards from the object store are read-only; they are never written
        warnings.simplefilter("ignore", UserWarning)
        emb = torch.as_tensor(shard["emb"]).to(device)
    if len(emb) == 0:  # a worker without texts still runs every step (all masked) to keep DDP in step
        emb = torch.zeros(1, emb.shape[1], device=device)
    buf = torch.empty(m * K, emb.shape[1], dtype=emb.dtype, device=device)  # reused: fresh 100 MB buffers fault pages
    row, question = shard["row"], shard["question"]
    answer = shard["answer"].astype(np.float32)
    for epoch in range(start_epoch, cfg.epochs):
        t0 = time.perf_counter()
        order, step, slot = epoch_layout(question, K, cfg.seed, epoch, rank)
        bounds = np.searchsorted(step, np.arange(n_steps + 1))
        stats = torch.zeros(2, dtype=torch.float64)  # sum of loss x pairs, pairs
        for s in range(n_steps):
            sel = order[bounds[s] : bounds[s + 1]]
            q, k = question[sel], slot[bounds[s] : bounds[s + 1]]
            idx = np.zeros((m, K), dtype=np.int64)
            y = np.zeros((m, K), dtype=np.float32)
            mask = np.zeros((m, K), dtype=bool)
            idx[q, k], y[q, k], mask[q, k] = row[sel], answer[sel], True
            torch.index_select(emb, 0, torch.from_numpy(idx).view(-1).to(device), out=buf)
            x = buf.view(m, K, -1).float()  # (m, K, d): head i's texts in x[i]
            logits = model(x)
            loss = masked_bce(logits, torch.from_numpy(y).to(device), torch.from_numpy(mask).to(device), pos_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats += torch.tensor([loss.item() * len(sel), len(sel)], dtype=torch.float64)
        if all_reduce is not None:
            stats = all_reduce(stats)
        seconds = time.perf_counter() - t0
        metrics = {"epoch": epoch + 1, "loss": float(stats[0] / max(stats[1], 1)), "pairs": int(stats[1]),
                   "steps": n_steps, "seconds": round(seconds, 3), "pairs_per_s": round(float(stats[1]) / max(seconds, 1e-9), 1),
                   "start_epoch": start_epoch}
        on_epoch_end(epoch, metrics)


def make_optimizer(heads: StackedHeads, cfg: TrainConfig) -> torch.optim.Adam:
    fused = heads.w1.device.type in ("cpu", "cuda") and heads.w1.dtype == torch.float32
    return torch.optim.Adam(heads.parameters(), lr=cfg.lr, fused=fused)


# --------------------------------------------------------------------------------------------- checkpoints


def save_checkpoint(folder: str, heads: StackedHeads, opt: torch.optim.Optimizer, epoch: int, extra: dict | None = None) -> None:
    """heads.safetensors + optimizer.safetensors (Adam moments and step per parameter) + state.json. No pickle."""
    from safetensors.torch import save_file  # noqa: PLC0415

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "heads.safetensors"), "wb") as f:
        f.write(heads.to_bytes())
    names = [n for n, _ in heads.named_parameters()]
    tensors = {}
    for i, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            tensors[f"{names[i]}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, os.path.join(folder, "optimizer.safetensors"))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"epoch": epoch, **(extra or {})}, f)


def load_checkpoint(folder: str, heads: StackedHeads | None = None, opt: torch.optim.Optimizer | None = None) -> tuple[StackedHeads, int]:
    """Restore heads (and the optimizer, when given) from a checkpoint folder; returns (heads, epochs done)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    loaded = StackedHeads.load(os.path.join(folder, "heads.safetensors"))
    if heads is None:
        heads = loaded
    else:
        heads.load_state_dict(loaded.state_dict())
    if opt is not None:
        tensors = load_file(os.path.join(folder, "optimizer.safetensors"))
        names = [n for n, _ in heads.named_parameters()]
        state = {}
        for i, name in enumerate(names):
            keys = {k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(name + ".")}
            if keys:
                state[i] = keys
        opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
    with open(os.path.join(folder, "state.json")) as f:
        epoch = int(json.load(f)["epoch"])
    return heads, epoch


# --------------------------------------------------------------------------------------------- Ray shell


def _train_loop_per_worker(config: dict) -> None:
    import ray  # noqa: PLC0415
    import ray.train  # noqa: PLC0415
    import ray.train.torch  # noqa: PLC0415

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
    if start_epoch >= cfg.epochs:  # a finished run started again: nothing left to train
        ray.train.report({"epoch": start_epoch, "start_epoch": start_epoch})
        return
    model = ray.train.torch.prepare_model(heads) if world > 1 else heads

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        if world == 1:
            return t
        import torch.distributed as dist  # noqa: PLC0415

        t = t.to(device)
        dist.all_reduce(t)
        return t.cpu()

    def on_epoch_end(epoch: int, metrics: dict) -> None:
        if rank == 0:
            log.info("train: epoch %d/%d loss %.4f pairs %d %.0f pairs/s %.1fs", metrics["epoch"], cfg.epochs,
                     metrics["loss"], metrics["pairs"], metrics["pairs_per_s"], metrics["seconds"])
            if config.get("progress_file"):
                write_progress(config["progress_file"], metrics)
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


def write_progress(path: str, metrics: dict) -> None:
    """Rank 0's last finished epoch, for the driver's progress bar (worker logs do not reach a quiet driver)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({k: metrics[k] for k in ("epoch", "loss") if k in metrics}, f)
    os.replace(tmp, path)


class EpochBar:
    """A tqdm bar on the driver that follows `progress.json` while `trainer.fit()` blocks (local runs only)."""

    def __init__(self, path: str | None, epochs: int, interval_s: float = 0.5):
        self.path, self.epochs, self.interval_s = path, epochs, interval_s
        self.enabled = bool(path) and os.environ.get("CQG_RAY_PROGRESS", "1") != "0"
        self.stop = threading.Event()

    def __enter__(self):
        if self.enabled:
            if os.path.exists(self.path):
                os.remove(self.path)
            self.thread = threading.Thread(target=self._follow, daemon=True)
            self.thread.start()
        return self

    def _follow(self) -> None:
        from tqdm.auto import tqdm  # noqa: PLC0415

        with tqdm(total=self.epochs, desc="train", unit="epoch") as bar:
            while True:
                stopping = self.stop.wait(self.interval_s)
                try:
                    with open(self.path) as f:
                        p = json.load(f)
                    bar.n = min(int(p["epoch"]), self.epochs)
                    bar.set_postfix(loss=f"{p['loss']:.4f}", refresh=False)
                    bar.refresh()
                except (OSError, ValueError, KeyError):
                    pass  # not written yet, or being replaced
                if stopping:
                    return

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()
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
    import ray  # noqa: PLC0415
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: PLC0415
    from ray.train.torch import TorchTrainer  # noqa: PLC0415

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
    run_dir = os.path.join(storage_path, name) if "://" not in storage_path else None
    if run_dir:
        os.makedirs(run_dir, exist_ok=True)
    log.info("train: %d pairs, %d questions, %d texts, d=%d, pos_weight=%.4f, %d workers, %d steps/epoch, %d epochs",
             len(pairs), pairs.n_questions, len(np.unique(pairs.doc)), embeddings.shape[1], pos_weight,
             cfg.num_workers, n_steps, cfg.epochs)
    config = {"cfg": cfg.model_dump(mode="json"), "shards": refs, "d": int(embeddings.shape[1]), "m": pairs.n_questions,
              "n_steps": n_steps, "pos_weight": pos_weight,
              "progress_file": os.path.join(run_dir, "progress.json") if run_dir else None}
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(storage_path=storage_path, name=name,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    with EpochBar(config["progress_file"], cfg.epochs):
        result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {name} in {storage_path} finished without a checkpoint")
    with result.checkpoint.as_directory() as folder:
        heads, epochs = load_checkpoint(folder)
    return TrainResult(heads, epochs, dict(result.metrics or {}), pos_weight, result.checkpoint.path)


# --------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def predict_pairs(heads: StackedHeads, embeddings: np.ndarray, doc: np.ndarray, question: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """P(yes) = sigma(C_q(e_doc)) for each (doc, question) pair, float32."""
    out = np.empty(len(doc), dtype=np.float32)
    device = heads.w1.device
    for i in range(0, len(doc), chunk):
        x = torch.as_tensor(np.asarray(embeddings[doc[i : i + chunk]]), device=device).to(heads.w1.dtype)
        q = torch.as_tensor(np.asarray(question[i : i + chunk], dtype=np.int64), device=device)
        out[i : i + chunk] = torch.sigmoid(heads.forward_pairs(x, q)).float().cpu().numpy()
    return out


def evaluate_heads(heads: StackedHeads, embeddings: np.ndarray, pairs: LabelPairs, tau: float = 0.5) -> dict:
    """The paper's Table 6 on these pairs: y_hat = 1[sigma(C_q(e)) > tau] against the LLM's answers."""
    probs = predict_pairs(heads, embeddings, pairs.doc, pairs.question)
    report = classification_report(pairs.answer, (probs > tau).astype(np.int8))
    report["tau"] = tau
    return report


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


def split_holdout(pairs: LabelPairs, fraction: float, seed: int = 0) -> tuple[LabelPairs, LabelPairs]:
    """(training pairs, held-out pairs): every pair of a held-out document (`holdout_docs`) goes to the second."""
    is_held = np.isin(pairs.doc, holdout_docs(pairs.doc, fraction, seed))
    return pairs.select(~is_held), pairs.select(is_held)
