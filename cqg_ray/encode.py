"""Encoding (`cqg-ray encode`): the frozen sentence encoder `Enc` over the whole corpus with Ray Data.

Work is cut into *units* (``cqg_ray.units``: a slice of rows of one corpus shard, ``unit_rows`` at most). A Ray Data
actor pool (one encoder per actor, a GPU per actor when the cluster has GPUs) takes units; each actor reads its
slice (only the shard's row groups that hold it: ``units.read_unit``), encodes it ``PROGRESS_TEXTS`` texts at a time
(`Encoder.encode`, or `Encoder.encode_tokens` on tokens from the CPU tokenizing stage) on the configured backend
(texts sorted by length inside, so little padding; L2-normalised), and writes
``<run>/encode/emb-<shard>-<start>.parquet`` atomically (columns doc_id, embedding: fixed-size list of float32 or
float16). A rerun skips units whose file exists whole and was written with the same model, dtype and max_seq_length
(``encode/_units.json``), so a killed encode resumes where it stopped and every row is written exactly once. Later
stages read the files with ``cqg_ray.artifacts.load_embeddings``. The manifest counts the bytes the units read
(``unit_bytes_read``) beside the prepared shards' size (``corpus_bytes``): about one read of each row when the shards'
row groups are no longer than a unit (prepare writes row groups of 1,000 rows, ``corpus.stage.ROW_GROUP_ROWS``, so a pass reads each row
once).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray import progress, stages
from cqg_ray.artifacts import corpus_shards, embeddings_table
from cqg_ray.config import ConfigError, EncodeConfig, PipelineConfig, RayConfig
from cqg_ray.pools import declared
from cqg_ray.rundir import RunDir, StageContext, documents_digest
from cqg_ray.token_limit import token_limit_counts, token_limit_note
from cqg_ray.units import UnitActor, actor_pool_size, limit_cpu_threads, pending_units, pool_threads, run_units, split_units, tokenize_stage

log = logging.getLogger("cqg_ray")


UNITS_SETTINGS = "_units.json"  # the encode settings the stage folder's unit files were written with
PROGRESS_TEXTS = 1024  # texts encoded between two advances of the progress counter (a few seconds on 2 cores)


class EncodeUnits(UnitActor):
    """Ray Data actor: one encoder per actor; encodes whole units and writes their files."""

    def __init__(self, cfg_json: str, run_uri: str, stage: str):
        import torch

        self.cfg = EncodeConfig.model_validate_json(cfg_json)
        limit_cpu_threads(self.cfg.torch_threads)
        from cqg_ray.encoder import default_batch_size, load_encoder

        self.model = load_encoder(self.cfg.model, backend=self.cfg.backend, device="cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = self.cfg.batch_size or default_batch_size(self.model.device)
        if self.cfg.max_seq_length:
            self.model.max_seq_length = self.cfg.max_seq_length
        self.run = RunDir(run_uri)
        self.stage = stage
        self.token_encoder = self.model

    @staticmethod
    def plan(texts: list[str], batch_size: int, st_order: bool) -> list:
        """`write_unit`'s chunks as (rows, mini-batches): PROGRESS_TEXTS texts at a time in the unit's order, each cut
        as `Encoder.encode` cuts it (what the CPU stage tokenizes for `write_tokens`)."""
        from cqg_ray.encoder import batch_plan

        return [(np.arange(i, min(i + PROGRESS_TEXTS, len(texts))), batch_plan(texts[i : i + PROGRESS_TEXTS], batch_size, st_order))
                for i in range(0, len(texts), PROGRESS_TEXTS)]

    def write_unit(self, name: str, doc_ids: pa.Array, texts: list[str]) -> None:
        parts = []
        for i in range(0, len(texts), PROGRESS_TEXTS):  # the texts counter advances within a unit
            parts.append(self.model.encode(texts[i : i + PROGRESS_TEXTS], batch_size=self.batch_size))
            progress.add(texts=len(parts[-1]))
        self._write(name, doc_ids, parts)

    def write_tokens(self, name: str, doc_ids: pa.Array, chunks: list) -> None:
        parts = []
        for rows, batches in chunks:  # rows: consecutive, in the unit's order (plan)
            parts.append(self.model.encode_tokens(len(rows), batches))
            progress.add(texts=len(rows))
        self._write(name, doc_ids, parts)

    def _write(self, name: str, doc_ids: pa.Array, parts: list) -> None:
        emb = np.concatenate(parts) if parts else self.model.encode([], batch_size=self.batch_size)
        emb = emb.astype(np.float16 if self.cfg.dtype == "float16" else np.float32, copy=False)
        self.run.write_table(f"{self.stage}/{name}", self.with_token_counts(embeddings_table(doc_ids, emb)))


def run_encode(cfg: PipelineConfig, ctx: StageContext) -> None:
    """The stage as the pipeline runs it: the encode section, with the ray section's declared resources for the pool."""
    encode(cfg.encode, ctx, cluster=cfg.ray)


def keep_units_of(run: RunDir, folder: str, cfg: EncodeConfig) -> None:
    """Remove the unit files written with other settings than ``cfg``'s hashed ones (model, dtype, max_seq_length: a
    changed config, or a killed encode's), so that a rerun resumes only its own units; record ``cfg``'s. A folder
    without the record (written before it) keeps its units."""
    settings = {f: getattr(cfg, f) for f in (path.split(".", 1)[1] for path in stages.get("encode").hashed)}
    before = run.read_json(f"{folder}/{UNITS_SETTINGS}") if run.exists(folder, UNITS_SETTINGS) else settings
    if before != settings:
        log.info("encode: the units in %s were written with %s, not %s: encoding again", folder, before, settings)
        for name in run.ls(folder, suffix=".parquet"):
            run.rm(folder, name)
    run.write_json(f"{folder}/{UNITS_SETTINGS}", settings)


def encode(cfg: EncodeConfig, ctx: StageContext, unit_rows: int | None = None, progress: bool = True,
           cluster: RayConfig | None = None) -> None:
    """Encode every prepared document; the actor pool starts with the actors that fit the cluster now and grows to
    those that fit ``cluster.max_cpus`` / ``cluster.max_gpus`` (`units.actor_pool_size`; default: what is there)."""
    import ray

    from cqg_ray.encoder import resolve_encoder_path
    from cqg_ray.pipeline import started_ray

    try:
        resolve_encoder_path(cfg.model)  # an unknown or missing bundled encoder: said once here, not by every actor's death
    except (ValueError, ImportError) as e:
        raise ConfigError(f"encode.model: {e}") from None
    run = ctx.run
    shards = [(p, pq.ParquetFile(p, filesystem=run.fs).metadata.num_rows) for p in corpus_shards(run)]
    units = split_units(shards, unit_rows or cfg.unit_rows)
    keep_units_of(run, ctx.stage, cfg)
    todo = pending_units(run, ctx.stage, units)  # a unit file damaged behind the manifest is encoded again, not resumed
    cluster = cluster or RayConfig()
    now = ray.cluster_resources()
    pool, gpus = actor_pool_size(cfg, now, declared(now, cluster.max_cpus, cluster.max_gpus), units=len(todo),
                                 local=started_ray())
    t0 = time.time()
    tokenize, pool = tokenize_stage(cfg, cfg.model, gpus, pool, run.root_uri, cfg.max_seq_length) if todo else (None, pool)
    threads = pool_threads(cfg.torch_threads, pool, gpus, tokenize, len(todo))
    log.info("encode: %d units (%d done before), %d rows, model %s, %d-%d actor(s) x %s", len(units), len(units) - len(todo),
             sum(n for _, n in shards), cfg.model, *pool, f"{gpus} GPU" if gpus else f"{threads} CPU thread(s)")
    actor_cfg = cfg.model_copy(update={"torch_threads": threads})
    rows_done, nodes, bytes_read, unit_s = run_units(todo, EncodeUnits, {"cfg_json": actor_cfg.model_dump_json(), "run_uri": run.root_uri, "stage": ctx.stage},
                                                     pool, gpus, threads, "encode", progress, run=run, tokenize=tokenize)
    wall = time.time() - t0
    files = run.ls(ctx.stage, suffix=".parquet")
    footers = [pq.ParquetFile(run.path(ctx.stage, f), filesystem=run.fs).metadata for f in files]
    total = sum(meta.num_rows for meta in footers)
    dim = footers[0].schema.to_arrow_schema().field("embedding").type.list_size
    digest = documents_digest(d for f in files for d in pq.read_table(run.path(ctx.stage, f), columns=["doc_id"], filesystem=run.fs)
                              .column("doc_id").to_pylist())
    run.check_documents(ctx.stage, digest, "prepare")  # every prepared document embedded once, no other
    ctx.extra["documents_digest"] = digest
    limit = token_limit_counts(footers)
    if note := token_limit_note("encode", limit):
        log.info(note)
    ctx.counts.update({"documents": total, "dim": dim, "units": len(units), "units_resumed": len(units) - len(todo),
                       "encoded_now": rows_done, "nodes_used": len(nodes), "texts_per_s": round(rows_done / wall, 1) if rows_done else None,
                       "wall_s": round(wall, 2), "unit_seconds": round(unit_s, 2),
                       "corpus_bytes": sum(run.fs.get_file_info(p).size for p, _ in shards), "unit_bytes_read": bytes_read,
                       "tokenize_stage": bool(tokenize), "threads_per_actor": 0 if gpus else threads, **limit})
    ctx.extra["model"] = cfg.model
    from cqg_ray.encoder import resolve_backend

    ctx.extra["backend"] = resolve_backend(cfg.backend, "cuda" if gpus else "cpu")  # auto as resolved on this (the driver's) machine

