"""The prepare stage (`cqg-ray prepare`) on Ray Data, and the readers of what it writes (``<run>/prepare/``).

Parts of up to ``ONE_TASK_BYTES`` (a sampled demo corpus, a test's) are deduplicated, sampled, sorted and written by
one Ray task (``clean.prepared_shards``: the same shards, row for row, as the passes below, which cost seconds each at
any size). Past that, every pass over the corpus runs in Ray workers and the driver holds counters only: one tally
per input file, the histogram of the sample keys (``corpus.limit``: the ``limit`` documents with the smallest seeded hash of their doc id
are kept; the cut comes from the histogram and the ~N / 4096 keys of one bin, ``clean.sample_cut``) and one summary
per written shard (rows, first and last doc id, documents digest). Dedup is exact and runs in the workers: the rows
are hash-partitioned by the first two hex digits of their text hash and each group keeps the first occurrence of
each text. Ids must be unique among the documents written: each shard's summary names an id it holds twice, and
since the shards are written from a sort by doc id, neighbouring shards that share an id at their edge name it too
(shards out of order fall back to one task that reads every id). A sample keeps every copy of an id or none, so an
id repeated only among documents the sample drops is not reported (before, the driver checked every id before
sampling).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cqg_ray.artifacts import add_digests
from cqg_ray.config import CorpusConfig
from cqg_ray.corpus.clean import SAMPLE_BINS, cut_bin, dedup_table, key_bins, prepared_shards, sample_cut, sample_keys
from cqg_ray.corpus.read import (KEPT_COUNTS, MAX_REPORTED_ERRORS, TSV_QUOTED_NOTE, CorpusError, list_files, parse_file, read_bytes,
                                 replaced_utf8_warning, rows_table)
from cqg_ray.rundir import RunDir, StageContext, documents_digest

log = logging.getLogger("cqg_ray")
ROW_GROUP_ROWS = 1_000  # rows per Parquet row group of a shard (encode.unit_rows is a multiple of it by default)


def unwrap_error(err: BaseException, kind: type[BaseException]) -> BaseException:
    """The innermost ``kind`` error in a chain of Ray wrappers (or the error itself): a task's RayTaskError is also a
    ``kind`` when its cause is one, but its text is the task's traceback."""
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        cause = getattr(e, "cause", None) or e.__cause__
        if isinstance(e, kind) and not isinstance(cause, kind):
            return e
        seen.add(id(e))
        e = cause
    text = str(err)
    marker = f"{kind.__module__}.{kind.__name__}: "
    if marker in text:
        return kind(text.split(marker, 1)[1].split("\n", 1)[0])
    return err


def parse_files(items: list[dict], cfg_json: str, parts_uri: str) -> list[dict]:
    """`_parse_one` for every file, as Ray tasks of one CPU with at most twice the cluster's CPUs in flight; the tallies
    in file order. The first error stops the tasks in flight (cancelled, and waited for) before it is raised. Plain
    tasks: the demo's prepare (one file) took 5.9-6.4 s with a Ray Data map over the files and 3.5-4.7 s with these,
    the same shards (2 cores, Intel AMX host, 2026-12-06)."""
    import ray

    parse = ray.remote(_parse_one).options(num_cpus=1)
    window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending, tallies = [], []
    try:
        for item in items:
            if len(pending) >= window:
                done, pending = ray.wait(pending, num_returns=1)
                tallies += ray.get(done)
            pending.append(parse.remote(item, cfg_json, parts_uri))
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            tallies += ray.get(done)
    except BaseException:  # a bad file, or Ctrl-C: the tasks in flight end before the caller hears of it, so that none
        for ref in pending:  # writes a part after it (the next prepare deletes the parts it finds, then parses anew)
            ray.cancel(ref)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=600)
        raise
    return sorted(tallies, key=lambda t: t["index"])


def _parse_one(row: dict, cfg_json: str, parts_uri: str) -> dict:
    """A Ray task: parse one file, write its rows to a part file, return the tally."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    uri, fmt, idx = row["uri"], row["format"], int(row["index"])
    res = parse_file(read_bytes(uri), fmt, uri, cfg)
    table = rows_table(res, uri, cfg.dedup)
    run = RunDir(parts_uri)
    run.write_table(f"part-{idx:06d}.parquet", table)
    return {"uri": uri, "index": idx, "rows": table.num_rows, "dropped": dict(res.dropped), "errors": list(res.errors)}


KEY = "_sample_key"  # the sample key column, while the corpus is sampled


def _add_key(batch: pa.Table, seed: int) -> pa.Table:
    return batch.append_column(KEY, pa.array(sample_keys(batch.column("doc_id").to_pylist(), seed), pa.float64()))


def _key_hist(batch: pa.Table) -> pa.Table:
    """Ray Data map: the histogram of a batch's sample keys (one row)."""
    hist = np.bincount(key_bins(batch.column(KEY).to_numpy()), minlength=SAMPLE_BINS)
    return pa.table({"hist": pa.array([hist.tolist()], pa.list_(pa.int64()))})


def _keys_in_bin(batch: pa.Table, b: int) -> pa.Table:
    keys = batch.column(KEY).to_numpy()
    return pa.table({KEY: pa.array(keys[key_bins(keys) == b], pa.float64())})


def _keep_sampled(batch: pa.Table, cut: float) -> pa.Table:
    return batch.filter(pa.array(batch.column(KEY).to_numpy() <= cut)).drop_columns([KEY])


def read_parts(paths: list[str], fs, rows: int, bucket: bool) -> Iterator[pa.Table]:
    """The parse step's part files, ``rows`` rows at a time, with the dedup ``bucket`` column (the text hash's first two
    hex digits) when ``bucket``."""
    for path in paths:
        for b in pq.ParquetFile(path, filesystem=fs).iter_batches(batch_size=rows):
            t = pa.Table.from_batches([b])
            yield t.append_column("bucket", pc.utf8_slice_codeunits(t.column("text_hash"), 0, 2)) if bucket else t


def _read_parts(batch: pa.Table, fs, rows: int, bucket: bool) -> Iterator[pa.Table]:
    """Ray Data map over part paths (a ``path`` column): `read_parts`, a block per batch."""
    yield from read_parts(batch.column("path").to_pylist(), fs, rows, bucket)


def _dedup_bucket(batch: pa.Table) -> pa.Table:
    table, _ = dedup_table(batch)
    return table


def _sample_cut(ds, limit: int) -> float:
    """The limit-th smallest sample key of a dataset with a key column, from two passes that return counters: a
    histogram of the keys, then the keys of the bin where the limit-th falls (~N / SAMPLE_BINS of them)."""
    hist = np.zeros(SAMPLE_BINS, np.int64)
    for b in ds.map_batches(_key_hist, batch_format="pyarrow", batch_size=100_000).iter_batches(batch_format="pyarrow", batch_size=None):
        for h in b.column("hist").to_pylist():
            hist += np.asarray(h, np.int64)
    b, below = cut_bin(hist, limit)
    keys = [t.column(KEY).to_numpy() for t in ds.map_batches(_keys_in_bin, fn_kwargs={"b": b}, batch_format="pyarrow")
            .iter_batches(batch_format="pyarrow", batch_size=None)]
    return sample_cut(np.concatenate(keys) if keys else np.zeros(0), limit, below)


def _shard_summary(stage_uri: str, name: str) -> dict:
    """Ray task: one written shard's rows, first and last doc id, whether its ids are sorted, a repeated id ("" if
    none) and its documents digest."""
    run = RunDir(stage_uri)
    ids = pq.read_table(run.path(name), columns=["doc_id"], filesystem=run.fs).column("doc_id").to_numpy(zero_copy_only=False)
    s = np.sort(ids)
    rep = s[1:][s[1:] == s[:-1]]
    return {"name": name, "rows": len(ids), "first": str(s[0]) if len(s) else "", "last": str(s[-1]) if len(s) else "",
            "sorted": bool(len(ids) < 2 or (ids[1:] >= ids[:-1]).all()), "repeated": str(rep[0]) if len(rep) else "",
            "digest": documents_digest(ids)}


def rows_of_id(fs, paths: list[str], doc_id: str, n: int = 2) -> list[dict]:
    """Up to n rows (doc_id, source, line) of the corpus files ``paths`` that hold ``doc_id``, in file order (Ray Data)."""
    import ray
    from ray.data.expressions import col

    rows = ray.data.read_parquet(paths, filesystem=fs).select_columns(["doc_id", "source", "line"]).filter(expr=col("doc_id") == doc_id)
    return sorted(rows.take(n), key=lambda r: (r["source"], r["line"]))


def first_repeated_rows(fs, paths: list[str]) -> list[dict]:
    """`repeated_id_rows` in one process: the first two rows (doc_id, source, line) in file order of the first id that
    the files hold more than once; [] when every id is unique."""
    if not paths:
        return []
    t = pa.concat_tables([pq.read_table(p, columns=["doc_id", "source", "line"], filesystem=fs) for p in paths])
    ids = t.column("doc_id")
    counts = pc.value_counts(ids)  # in order of first appearance
    twice = counts.filter(pc.greater(counts.field("counts"), 1))
    if not len(twice):
        return []
    rows = t.filter(pc.equal(ids, twice[0]["values"])).slice(0, 2).to_pylist()
    return sorted(rows, key=lambda r: (r["source"], r["line"]))


def row_places(rows: list[dict]) -> str:
    """Rows named by file:line, for an error ("a.jsonl:1 and a.jsonl:3")."""
    return " and ".join(f"{r['source']}:{r['line']}" for r in rows)


def repeated_id_rows(fs, paths: list[str]) -> list[dict]:
    """Two rows (doc_id, source, line) of an id that the corpus files ``paths`` hold more than once; [] when every id
    is unique. Files of ONE_TASK_BYTES in all are read by one task (`first_repeated_rows`: a Ray Data groupby cost ~15
    s on 2 cores even for two rows), larger ones by a Ray Data groupby; the driver holds no ids."""
    import ray
    from ray.data.expressions import col

    if sum(fs.get_file_info(p).size for p in paths) <= ONE_TASK_BYTES:
        return ray.get(ray.remote(first_repeated_rows).options(num_cpus=1).remote(fs, paths))
    ids = ray.data.read_parquet(paths, filesystem=fs).select_columns(["doc_id"])
    twice = ids.groupby("doc_id").count().filter(expr=col("count()") > 1).take(1)
    return rows_of_id(fs, paths, twice[0]["doc_id"]) if twice else []


def repeated_id(summaries: list[dict]) -> str | None:
    """A doc id that two shards or one shard hold twice, from the shards' summaries ("" if none), when each shard is
    sorted and the shards hold ascending ranges that touch at most at one id (what a sort writes); None when they do
    not, so that only reading every id can tell."""
    for s in summaries:
        if s["repeated"]:
            return s["repeated"]
    ordered = sorted((s for s in summaries if s["rows"]), key=lambda s: (s["first"], s["last"]))
    if not all(s["sorted"] for s in ordered):
        return None
    for a, b in zip(ordered, ordered[1:]):
        if a["last"] == b["first"]:
            return b["first"]
        if a["last"] > b["first"]:
            return None
    return ""


ONE_TASK_BYTES = 256 << 20  # parsed parts up to this size are deduplicated, sampled and written by one task: Ray Data's
# shuffles (dedup, sort) cost seconds each on 2 cores at any size (a 340k-row corpus sampled to 3,000: 23 s of prepare)
SHUFFLE_BATCH_BYTES = 64 << 20  # input a dedup shuffle task partitions at once (Ray Data's default, 1 GiB, is a whole 1M corpus)


def prepare(cfg: CorpusConfig, ctx: StageContext) -> None:
    """Read, clean, dedup, sample and write the corpus under ``ctx.uri``."""
    import ray.data

    data_ctx = ray.data.DataContext.get_current()
    before = data_ctx.shuffle_input_batch_bytes
    data_ctx.shuffle_input_batch_bytes = min(before, SHUFFLE_BATCH_BYTES)
    try:
        _prepare(cfg, ctx)
    finally:
        data_ctx.shuffle_input_batch_bytes = before


def _prepare(cfg: CorpusConfig, ctx: StageContext) -> None:
    import ray

    files = list_files(cfg.paths, cfg.format)
    log.info("prepare: %d file(s)", len(files))
    run = ctx.run
    parts_rel = f"{ctx.stage}/_parts"
    run.rm(parts_rel)  # a failed or killed prepare's parts (of files maybe no longer configured) are not this corpus
    run.makedirs(parts_rel)
    items = [{"uri": u, "format": f, "index": i} for i, (u, f) in enumerate(files)]
    cfg_json = cfg.model_dump_json()
    parts_uri = run.uri(parts_rel)
    try:
        tallies = parse_files(items, cfg_json, parts_uri)
    except Exception as e:  # a CorpusError inside a Ray task arrives wrapped; give the user the plain message
        raise unwrap_error(e, CorpusError) from None

    dropped: Counter = Counter()
    errors: list[str] = []
    for t in tallies:
        dropped.update(t["dropped"])
        errors.extend(t["errors"])
    for e in errors[:MAX_REPORTED_ERRORS]:
        log.warning("prepare: %s", e)
    if dropped.get("utf8_replaced"):  # kept, but maybe not what the file meant (another encoding, binary)
        log.warning(replaced_utf8_warning("prepare", dropped["utf8_replaced"]))
    if dropped.get("tsv_quoted"):
        log.info("prepare: %d %s", dropped["tsv_quoted"], TSV_QUOTED_NOTE)
    read_rows = sum(t["rows"] for t in tallies)
    parts = [run.path(parts_rel, n) for n in run.ls(parts_rel, suffix=".parquet")]
    for name in run.ls(ctx.stage, suffix=".parquet"):
        run.rm(ctx.stage, name)
    if sum(run.fs.get_file_info(p).size for p in parts) <= ONE_TASK_BYTES:
        one_task = ray.remote(_prepare_in_one_task).options(num_cpus=1)
        n_docs = ray.get(one_task.remote(parts, cfg_json, ctx.uri, min(ROW_GROUP_ROWS, cfg.rows_per_shard)))
    else:
        n_docs = _prepare_with_ray_data(cfg, run, ctx.uri, parts, read_rows)
    if n_docs == 0:
        why = f"after cleaning ({dict(dropped)})" if dropped else f"(no rows in its {len(files)} file(s))"
        raise CorpusError(f"the corpus is empty {why}; nothing to do")
    n_dups = read_rows - n_docs if cfg.dedup else 0
    # Counters per written shard, from the workers: rows, digest, and what tells a repeated id
    shards = run.ls(ctx.stage, suffix=".parquet")
    summarize = ray.remote(_shard_summary).options(num_cpus=1)
    summaries = ray.get([summarize.remote(ctx.uri, n) for n in shards])  # one small dict a shard
    rep, paths = repeated_id(summaries), [run.path(ctx.stage, n) for n in shards]
    if rep is None:  # the summaries cannot tell: every id is read (a Ray Data groupby)
        rows = repeated_id_rows(run.fs, paths)
    else:
        rows = rows_of_id(run.fs, paths, rep) if rep else []
    if rows:  # ids must be unique (an id column with repeats is a data error worth stopping for)
        raise CorpusError(f"document id {rows[0]['doc_id']!r} appears more than once ({row_places(rows)}; check corpus.id_column)")
    n_out = sum(s["rows"] for s in summaries)
    ctx.extra["documents_digest"] = add_digests(s["digest"] for s in summaries)
    run.rm(parts_rel)
    ctx.counts.update({
        "files": len(files), "read_rows": read_rows, "duplicates": n_dups, "sampled_out": n_docs - n_out,
        "documents": n_out, **{KEPT_COUNTS.get(k, f"dropped_{k}"): v for k, v in dropped.items()},
    })
    run.write_json(f"{ctx.stage}/stats.json", {**ctx.counts, "errors": errors[:MAX_REPORTED_ERRORS]})


def _prepare_with_ray_data(cfg: CorpusConfig, run: RunDir, stage_uri: str, parts: list[str], read_rows: int) -> int:
    """Dedup, sample, sort and write the parts as shards in Ray Data passes (a corpus of any size: the driver holds
    counters); returns the documents before sampling (0: nothing written)."""
    import ray

    # one task a part, reading it in blocks of at most rows_per_shard rows (read_parquet packs several files into one
    # task and one block: 700k rows of a 1M corpus in one worker)
    dedup = bool(cfg.dedup and read_rows)
    ds = ray.data.from_items([{"path": p} for p in parts], override_num_blocks=max(1, len(parts))).map_batches(
        _read_parts, fn_kwargs={"fs": run.fs, "rows": cfg.rows_per_shard, "bucket": dedup}, batch_format="pyarrow", batch_size=1)
    if dedup:
        # Exact dedup at scale: hash-partition by text hash (the bucket column), dedup inside each group.
        ds = (ds.groupby("bucket", num_partitions=max(1, min(256, read_rows // 50_000)))
              .map_groups(_dedup_bucket, batch_format="pyarrow").drop_columns(["bucket"]))
    ds = ds.drop_columns(["text_hash"])
    sampling = cfg.limit is not None
    if sampling:
        ds = ds.map_batches(_add_key, fn_kwargs={"seed": cfg.sample_seed}, batch_format="pyarrow")
    ds = ds.materialize()
    n_docs = ds.count() if read_rows else 0
    if n_docs == 0:
        return 0
    if sampling and n_docs > cfg.limit:
        # order-independent seeded sample: keep the `limit` documents with the smallest sample keys
        ds = ds.map_batches(_keep_sampled, fn_kwargs={"cut": _sample_cut(ds, cfg.limit)}, batch_format="pyarrow")
    elif sampling:
        ds = ds.drop_columns([KEY])
    # Shards sorted by doc_id: the corpus does not depend on how the reading was split.
    ds = ds.sort("doc_id")
    n_out = min(n_docs, cfg.limit) if sampling else n_docs
    ds = ds.repartition(max(1, -(-n_out // cfg.rows_per_shard)), shuffle=False)  # ordered, equal blocks: one shard each
    # Row groups of ROW_GROUP_ROWS: an encode unit (a multiple of it) and a streaming LLM stage's batch read only theirs.
    # (Ray makes a row group at least min_rows_per_file, so the shards' size comes from the blocks above.)
    ds.write_parquet(stage_uri, filesystem=None if run.local else run.fs, max_rows_per_file=cfg.rows_per_shard,
                     filename_provider=_ShardNames(), row_group_size=min(ROW_GROUP_ROWS, cfg.rows_per_shard), write_page_checksum=True)
    return n_docs


def _prepare_in_one_task(parts: list[str], cfg_json: str, stage_uri: str, row_group_rows: int) -> int:
    """Ray task: the parts deduplicated, sampled, sorted and written as the shards `_prepare_with_ray_data` writes
    (`clean.prepared_shards`; names ``part-<shard>-<write>.parquet``, row groups of ``row_group_rows``); returns the
    documents before sampling (0: nothing written)."""
    cfg = CorpusConfig.model_validate_json(cfg_json)
    run = RunDir(stage_uri)
    table = pa.concat_tables([pq.read_table(p, filesystem=run.fs) for p in parts])
    shards, n_docs = prepared_shards(table, cfg.dedup, cfg.limit, cfg.sample_seed, cfg.rows_per_shard)
    write = uuid.uuid4().hex
    for i, shard in enumerate(shards):
        run.write_table(f"part-{i:06d}-{write}.parquet", shard, row_group_size=row_group_rows)
    return n_docs


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
