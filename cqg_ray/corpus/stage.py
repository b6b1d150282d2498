"""The prepare stage (`cqg-ray prepare`) on Ray Data, and the readers of what it writes (``<run>/prepare/``)."""

from __future__ import annotations

import json
import logging
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.config import CorpusConfig
from cqg_ray.corpus.clean import dedup_table, sample_key
from cqg_ray.corpus.read import MAX_REPORTED_ERRORS, CorpusError, list_files, parse_file, read_bytes, rows_table
from cqg_ray.rundir import RunDir, StageContext, documents_digest

log = logging.getLogger("cqg_ray")


def unwrap_error(err: BaseException, kind: type[BaseException]) -> BaseException:
    """The first ``kind`` error in a chain of Ray wrappers (or the error itself)."""
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = getattr(e, "cause", None) or e.__cause__
    text = str(err)
    marker = f"{kind.__module__}.{kind.__name__}: "
    if marker in text:
        return kind(text.split(marker, 1)[1].split("\n", 1)[0])
    return err


def _parse_one(row: dict, cfg_json: str, parts_uri: str) -> dict:
    """Ray Data map: parse one file, write its rows to a part file, return the tally."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    uri, fmt, idx = row["uri"], row["format"], int(row["index"])
    res = parse_file(read_bytes(uri), fmt, uri, cfg)
    table = rows_table(res, uri, cfg.dedup)
    run = RunDir(parts_uri)
    run.write_table(f"part-{idx:06d}.parquet", table)
    return {"uri": uri, "rows": table.num_rows, "dropped": json.dumps(dict(res.dropped)), "errors": json.dumps(res.errors)}


def _keep_sampled(batch: pa.Table, seed: int, cut: float) -> pa.Table:
    keys = np.array([sample_key(d, seed) for d in batch.column("doc_id").to_pylist()])
    return batch.filter(pa.array(keys <= cut))


def _dedup_bucket(batch: pa.Table) -> pa.Table:
    table, _ = dedup_table(batch)
    return table


def prepare(cfg: CorpusConfig, ctx: StageContext) -> None:
    """Read, clean, dedup, sample and write the corpus under ``ctx.uri``."""
    import ray

    files = list_files(cfg.paths, cfg.format)
    log.info("prepare: %d file(s)", len(files))
    run = ctx.run
    parts_rel = f"{ctx.stage}/_parts"
    run.makedirs(parts_rel)
    items = [{"uri": u, "format": f, "index": i} for i, (u, f) in enumerate(files)]
    cfg_json = cfg.model_dump_json()
    parts_uri = run.uri(parts_rel)
    try:
        tallies = ray.data.from_items(items).map(_parse_one, fn_kwargs={"cfg_json": cfg_json, "parts_uri": parts_uri}).take_all()
    except Exception as e:  # a CorpusError inside a Ray task arrives wrapped; give the user the plain message
        raise unwrap_error(e, CorpusError) from None

    dropped: Counter = Counter()
    errors: list[str] = []
    for t in tallies:
        dropped.update(json.loads(t["dropped"]))
        errors.extend(json.loads(t["errors"]))
    for e in errors[:MAX_REPORTED_ERRORS]:
        log.warning("prepare: %s", e)
    read_rows = sum(t["rows"] for t in tallies)

    ds = ray.data.read_parquet(parts_uri, filesystem=run.fs if not run.local else None)
    n_dups = 0
    if cfg.dedup and read_rows:
        # Exact dedup at scale: hash-partition by text hash, dedup inside each group.
        ds = ds.add_column("bucket", lambda b: __import__("pyarrow.compute").compute.utf8_slice_codeunits(b["text_hash"], 0, 2), batch_format="pyarrow")
        ds = (ds.groupby("bucket", num_partitions=max(1, min(256, read_rows // 50_000)))
              .map_groups(_dedup_bucket, batch_format="pyarrow").drop_columns(["bucket"]))
    ds = ds.drop_columns(["text_hash"]).materialize()
    n_docs = ds.count() if read_rows else 0
    if cfg.dedup:
        n_dups = read_rows - n_docs
    if n_docs == 0:
        raise CorpusError(f"the corpus is empty after cleaning ({dict(dropped)}); nothing to do")
    # ids must be unique (an id column with repeats is a data error worth stopping for); only the id column
    # travels to the driver (~20 bytes a document).
    ids = np.sort(np.concatenate([b["doc_id"].to_numpy(zero_copy_only=False) for b in
                                  ds.select_columns(["doc_id"]).iter_batches(batch_format="pyarrow", batch_size=None)]))
    if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
        dup = ids[1:][ids[1:] == ids[:-1]][0]
        raise CorpusError(f"document id {dup!r} appears more than once (check corpus.id_column)")
    if cfg.limit is not None and n_docs > cfg.limit:
        # order-independent seeded sample: keep the `limit` documents with the smallest sample keys
        keys = np.array([sample_key(d, cfg.sample_seed) for d in ids])
        cut = np.partition(keys, cfg.limit - 1)[cfg.limit - 1]
        seed = cfg.sample_seed
        ds = ds.map_batches(_keep_sampled, fn_kwargs={"seed": seed, "cut": cut}, batch_format="pyarrow")
    # Shards sorted by doc_id: the corpus does not depend on how the reading was split.
    ds = ds.sort("doc_id")
    for name in run.ls(ctx.stage, suffix=".parquet"):
        run.rm(ctx.stage, name)
    ds.write_parquet(ctx.uri, filesystem=None if run.local else run.fs, min_rows_per_file=cfg.rows_per_shard,
                     max_rows_per_file=cfg.rows_per_shard, filename_provider=_ShardNames())
    shards = run.ls(ctx.stage, suffix=".parquet")
    n_out = sum(pq.ParquetFile(run.path(ctx.stage, n), filesystem=run.fs).metadata.num_rows for n in shards)
    ctx.extra["documents_digest"] = documents_digest(
        d for n in shards for d in pq.read_table(run.path(ctx.stage, n), columns=["doc_id"], filesystem=run.fs).column("doc_id").to_pylist())
    n_before_limit, table_rows = n_docs, n_out
    run.rm(parts_rel)
    ctx.counts.update({
        "files": len(files), "read_rows": read_rows, "duplicates": n_dups, "sampled_out": n_before_limit - table_rows,
        "documents": table_rows, **{(f"dropped_{k}" if k != "utf8_replaced" else "replaced_invalid_utf8"): v for k, v in dropped.items()},
    })
    run.write_json(f"{ctx.stage}/stats.json", {**ctx.counts, "errors": errors[:MAX_REPORTED_ERRORS]})


class _ShardNames:
    """Shard file names ``part-<write>-<task>.parquet`` (Ray Data FilenameProvider protocol)."""

    def __new__(cls):
        from ray.data.datasource import FilenameProvider

        class ShardNames(FilenameProvider):
            def get_filename_for_task(self, write_uuid, task_index):
                return f"part-{task_index:06d}-{write_uuid}.parquet"

            def get_filename_for_block(self, block, write_uuid, task_index, block_index):
                return f"part-{task_index:06d}-{block_index:04d}-{write_uuid}.parquet"

        return ShardNames()
