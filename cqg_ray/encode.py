"""Encoding (`cqg-ray encode`): the frozen sentence encoder `Enc` over the whole corpus with Ray Data.

Work is cut into *units* (a slice of rows of one corpus shard, ``units_rows`` at most). A Ray Data
actor pool (one encoder per actor, a GPU per actor when the cluster has GPUs) takes units; each actor
reads its slice, encodes it in one sentence-transformers call (texts sorted by length inside, so little
padding), L2-normalises, and writes ``<run>/encode/emb-<shard>-<start>.parquet`` atomically
(columns doc_id, embedding: fixed-size list of float32 or float16). A rerun skips units whose file
exists, so a killed encode resumes where it stopped and every row is written exactly once. Later stages read
the files with ``cqg_ray.artifacts.load_embeddings``.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.artifacts import corpus_shards, embeddings_table
from cqg_ray.config import EmbedConfig, EncodeConfig
from cqg_ray.rundir import RunDir, StageContext

log = logging.getLogger("cqg_ray")

UNIT_ROWS = 10_000


def unit_name(shard_path: str, start: int) -> str:
    stem = os.path.basename(shard_path).rsplit(".", 1)[0]
    return f"emb-{stem}-{start:09d}.parquet"


def plan_units(shards: list[tuple[str, int]], unit_rows: int = UNIT_ROWS) -> list[dict]:
    """Cut shards (path, rows) into units of at most unit_rows rows (pure)."""
    units = []
    for path, n in shards:
        for start in range(0, n, unit_rows):
            units.append({"shard": path, "start": start, "stop": min(n, start + unit_rows), "name": unit_name(path, start)})
    return units


def pending_units(run: RunDir, folder: str, units: list[dict]) -> list[dict]:
    """The units whose file is not written yet; unit files of another plan (other unit size or inputs) are removed."""
    have = {n for n in run.ls(folder, suffix=".parquet") if n.startswith("emb-")}
    for stray in have - {u["name"] for u in units}:
        run.rm(folder, stray)
    return [u for u in units if u["name"] not in have]


def normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def limit_cpu_threads(threads: int) -> None:
    """Keep a CPU actor to the CPUs Ray gave it: torch's intra-op threads, and with one thread the tokenizer's own
    pool too (it would spread over every core of the node). Nothing on a GPU actor."""
    import torch

    if torch.cuda.is_available():
        return
    torch.set_num_threads(threads)
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


class UnitActor:
    """Base of the Ray Data actors `run_units` drives: reads each unit's rows from its shard, hands them to
    `write_unit`, and reports rows, seconds and node per unit. Subclasses set `self.run` and define `write_unit`."""

    run: RunDir

    def write_unit(self, name: str, doc_ids: pa.Array, texts: list[str]) -> None:
        raise NotImplementedError

    def __call__(self, batch: dict) -> dict:
        import ray

        node = ray.get_runtime_context().get_node_id()
        out = {"name": [], "rows": [], "seconds": [], "node": []}
        for shard, start, stop, name in zip(batch["shard"], batch["start"], batch["stop"], batch["name"]):
            t0 = time.time()
            table = pq.read_table(shard, columns=["doc_id", "text"], filesystem=self.run.fs).slice(int(start), int(stop) - int(start))
            texts = table.column("text").to_pylist()
            self.write_unit(str(name), table.column("doc_id"), texts)
            out["name"].append(name)
            out["rows"].append(len(texts))
            out["seconds"].append(time.time() - t0)
            out["node"].append(node)
        return {k: np.array(v) for k, v in out.items()}


class EncodeUnits(UnitActor):
    """Ray Data actor: one encoder per actor; encodes whole units and writes their files."""

    def __init__(self, cfg_json: str, run_uri: str, stage: str):
        import torch

        self.cfg = EncodeConfig.model_validate_json(cfg_json)
        limit_cpu_threads(self.cfg.torch_threads)
        from cqg_ray.encoder import load_encoder

        self.model = load_encoder(self.cfg.model, device="cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = self.cfg.batch_size or (128 if torch.cuda.is_available() else 32)
        if self.cfg.max_seq_length:
            self.model.max_seq_length = self.cfg.max_seq_length
        self.run = RunDir(run_uri)
        self.stage = stage

    def write_unit(self, name: str, doc_ids: pa.Array, texts: list[str]) -> None:
        emb = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
        emb = emb.astype(np.float16 if self.cfg.dtype == "float16" else np.float32, copy=False)
        self.run.write_table(f"{self.stage}/{name}", embeddings_table(doc_ids, emb))


def actor_plan(cfg: EncodeConfig | EmbedConfig, cluster_resources: dict) -> tuple[int, float]:
    """(number of actors, GPUs per actor) from the config and the cluster (pure); the encode stage and batch
    embedding both size their pools with it (num_actors, num_gpus_per_actor, torch_threads)."""
    gpus = float(cluster_resources.get("GPU", 0))
    per = cfg.num_gpus_per_actor if cfg.num_gpus_per_actor is not None else (1.0 if gpus >= 1 else 0.0)
    if cfg.num_actors is not None:
        return cfg.num_actors, per
    if per > 0:
        return max(1, int(gpus // per)), per
    cpus = float(cluster_resources.get("CPU", 1))
    return max(1, int(cpus // cfg.torch_threads)), 0.0


def run_units(units: list[dict], actor_cls, constructor_kwargs: dict, n_actors: int, gpus: float, threads: int,
              desc: str, progress: bool = True) -> tuple[int, set[str]]:
    """Send work units to a Ray Data pool of ``actor_cls`` (one unit per call; each call returns rows and node per unit).

    Shared by the encode stage and batch embedding. Returns (rows done, ids of the nodes that did them).
    """
    import ray
    from tqdm import tqdm

    rows_done, nodes = 0, set()
    if not units:
        return rows_done, nodes
    ds = ray.data.from_items(units, override_num_blocks=len(units)).map_batches(
        actor_cls,
        fn_constructor_kwargs=constructor_kwargs,
        compute=ray.data.ActorPoolStrategy(size=n_actors),
        batch_size=1,
        num_gpus=gpus or None,
        num_cpus=0 if gpus else threads,
    )
    with tqdm(total=sum(u["stop"] - u["start"] for u in units), unit="text", desc=desc, disable=not progress) as bar:
        for row in ds.iter_rows():
            bar.update(int(row["rows"]))
            rows_done += int(row["rows"])
            nodes.add(str(row["node"]))
    return rows_done, nodes


def encode(cfg: EncodeConfig, ctx: StageContext, unit_rows: int | None = None, progress: bool = True) -> None:
    import ray

    run = ctx.run
    shards = [(p, pq.ParquetFile(p, filesystem=run.fs).metadata.num_rows) for p in corpus_shards(run)]
    units = plan_units(shards, unit_rows or cfg.unit_rows)
    todo = pending_units(run, ctx.stage, units)
    n_actors, gpus = actor_plan(cfg, ray.cluster_resources())
    n_actors = max(1, min(n_actors, len(todo)))
    log.info("encode: %d units (%d done before), %d rows, model %s, %d actor(s) x %s GPU", len(units), len(units) - len(todo),
             sum(n for _, n in shards), cfg.model, n_actors, gpus)
    t0 = time.time()
    rows_done, nodes = run_units(todo, EncodeUnits, {"cfg_json": cfg.model_dump_json(), "run_uri": run.root_uri, "stage": ctx.stage},
                                 n_actors, gpus, cfg.torch_threads, "encode", progress)
    wall = time.time() - t0
    files = run.ls(ctx.stage, suffix=".parquet")
    total = sum(pq.ParquetFile(run.path(ctx.stage, f), filesystem=run.fs).metadata.num_rows for f in files)
    dim = pq.ParquetFile(run.path(ctx.stage, files[0]), filesystem=run.fs).schema_arrow.field("embedding").type.list_size
    ctx.counts.update({"documents": total, "dim": dim, "units": len(units), "units_resumed": len(units) - len(todo),
                       "encoded_now": rows_done, "nodes_used": len(nodes), "texts_per_s": round(rows_done / wall, 1) if rows_done else None})
    ctx.extra["model"] = cfg.model

