"""Work units over a Ray Data actor pool, shared by the encode stage and batch embedding (`cqg-ray embed`).

A unit is a slice of rows of one Parquet shard, written as one output file ``emb-<shard>-<start>.parquet``; a rerun
skips the units whose file exists, so a killed pass resumes where it stopped and writes every row exactly once.

A unit reads only its own rows (`read_unit`): the row groups of its shard that hold them (doc_id and text column chunks),
and the shard's footer once per actor (exactly its bytes, cached), so a pass reads each row group once when the shards'
row groups end where units do (``cqg-ray embed`` writes its snapshot with row groups of ``unit_rows``). Each unit reports
the bytes it read; ``run_units`` returns their sum.

    units = pending_units(run, folder, split_units(shards, unit_rows))
    now = ray.cluster_resources()
    rows, nodes, bytes_read = run_units(units, MyUnits, kwargs, *actor_pool_size(cfg, now, declared(now, max_cpus, max_gpus)), threads, "encode")
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray import progress
from cqg_ray.config import EmbedConfig, EncodeConfig
from cqg_ray.pools import pool_range
from cqg_ray.rundir import RunDir

UNIT_ROWS = 10_000


def unit_name(shard_path: str, start: int) -> str:
    stem = os.path.basename(shard_path).rsplit(".", 1)[0]
    return f"emb-{stem}-{start:09d}.parquet"


def split_units(shards: list[tuple[str, int]], unit_rows: int = UNIT_ROWS) -> list[dict]:
    """Cut shards (path, rows) into units of at most unit_rows rows (pure)."""
    units = []
    for path, n in shards:
        for start in range(0, n, unit_rows):
            units.append({"shard": path, "start": start, "stop": min(n, start + unit_rows), "name": unit_name(path, start)})
    return units


def pending_units(run: RunDir, folder: str, units: list[dict]) -> list[dict]:
    """The units whose file is not written yet; unit files of another plan (other unit size or inputs) and the temp
    files of interrupted writes are removed."""
    run.remove_partial(folder)
    have = {n for n in run.ls(folder, suffix=".parquet") if n.startswith("emb-")}
    for stray in have - {u["name"] for u in units}:
        run.rm(folder, stray)
    return [u for u in units if u["name"] not in have]


def limit_cpu_threads(threads: int) -> None:
    """Keep a CPU actor to the CPUs Ray gave it: torch's intra-op threads, and with one thread the tokenizer's own
    pool too (it would spread over every core of the node). Nothing on a GPU actor."""
    import torch

    if torch.cuda.is_available():
        return
    torch.set_num_threads(threads)
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


class CountingFile:
    """A readable, seekable file over a pyarrow file that counts the bytes read through it (``bytes_read``); what
    `read_unit` hands to Parquet, so that a unit's reads are measured, not estimated."""

    def __init__(self, f):
        self.f, self.bytes_read, self.closed = f, 0, False

    def read(self, n: int = -1) -> bytes:
        data = self.f.read() if n is None or n < 0 else self.f.read(n)
        self.bytes_read += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()

    def size(self) -> int:
        return self.f.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self.f.close()


def read_footer(f: CountingFile) -> pq.FileMetaData:
    """A Parquet file's metadata, reading exactly its footer (length, magic and the Thrift bytes): Arrow's own
    reader fetches the last 64 KiB, most of a small file."""
    size = f.size()
    f.seek(size - 8)
    tail = f.read(8)
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise OSError("not a Parquet file (no PAR1 footer)")
    n = int.from_bytes(tail[:4], "little")
    f.seek(size - 8 - n)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + f.read(n) + tail))


def row_groups_for(meta: pq.FileMetaData, start: int, stop: int) -> tuple[list[int], int]:
    """(the row groups that hold rows [start, stop), the first one's row number) (pure but for the metadata)."""
    groups, first, row = [], None, 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if row < stop and row + n > start:
            groups.append(g)
            first = row if first is None else first
        row += n
    return groups, (start if first is None else first)


def read_unit(fs, path: str, start: int, stop: int, columns: tuple[str, ...] = ("doc_id", "text"),
              meta: pq.FileMetaData | None = None) -> tuple[pa.Table, int, pq.FileMetaData]:
    """Rows [start, stop) of one Parquet file, reading only the row groups that hold them (``columns`` only) and the
    footer when ``meta`` is not given. Returns (table, bytes read from ``fs``, the file's metadata)."""
    with fs.open_input_file(path) as raw:
        f = CountingFile(raw)
        meta = meta or read_footer(f)
        groups, first = row_groups_for(meta, start, stop)
        if groups:
            table = pq.ParquetFile(pa.PythonFile(f, mode="r"), metadata=meta).read_row_groups(groups, columns=list(columns))
        else:
            table = meta.schema.to_arrow_schema().empty_table().select(list(columns))
        return table.slice(start - first, stop - start), f.bytes_read, meta


class UnitActor:
    """Base of the Ray Data actors `run_units` drives: reads each unit's rows from its shard (`read_unit`: only the
    row groups that hold them; each shard's footer once per actor), hands them to `write_unit`, and reports rows,
    bytes read, seconds and node per unit. Subclasses set `self.run` and define `write_unit`."""

    run: RunDir
    FOOTERS = 16  # shards whose metadata an actor keeps (units come in shard order)

    def write_unit(self, name: str, doc_ids: pa.Array, texts: list[str]) -> None:
        raise NotImplementedError

    def read(self, shard: str, start: int, stop: int) -> tuple[pa.Table, int]:
        """The unit's doc_id and text columns, and the bytes read for them."""
        footers = self.__dict__.setdefault("_footers", OrderedDict())
        table, nbytes, footers[shard] = read_unit(self.run.fs, shard, start, stop, meta=footers.get(shard))
        footers.move_to_end(shard)
        while len(footers) > self.FOOTERS:
            footers.popitem(last=False)
        return table, nbytes

    def __call__(self, batch: dict) -> dict:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        out = {"name": [], "rows": [], "bytes": [], "seconds": [], "node": []}
        for shard, start, stop, name in zip(batch["shard"], batch["start"], batch["stop"], batch["name"]):
            t0 = time.time()
            table, nbytes = self.read(str(shard), int(start), int(stop))
            texts = table.column("text").to_pylist()
            before = progress.snapshot()["texts"]
            self.write_unit(str(name), table.column("doc_id"), texts)
            progress.add(texts=max(0, len(texts) - (progress.snapshot()["texts"] - before)))  # what write_unit did not count as it went
            progress.flush_relay()
            out["name"].append(name)
            out["rows"].append(len(texts))
            out["bytes"].append(nbytes)
            out["seconds"].append(time.time() - t0)
            out["node"].append(node)
        return {k: np.array(v) for k, v in out.items()}


def actor_pool_size(cfg: EncodeConfig | EmbedConfig, now: dict, most: dict | None = None,
                    units: int | None = None) -> tuple[tuple[int, int], float]:
    """((min, max) actors, GPUs per actor) from the config and the cluster (pure); the encode stage and batch embedding
    both size their pools with it (num_actors, num_gpus_per_actor, torch_threads).

    ``now``: the cluster's resources when the stage starts; ``most``: what it is declared to grow to
    (``pools.declared`` of ``ray.max_cpus`` / ``ray.max_gpus``; default ``now``). The pool starts with the actors
    that fit now and grows to those that fit ``most``, so a fixed cluster keeps a fixed pool. GPU actors (one GPU
    each unless num_gpus_per_actor says otherwise) when the cluster has or may get a GPU, else CPU actors of
    torch_threads CPUs; a configured num_actors fixes both ends. With ``units``, at most one actor per unit (at
    least one)."""
    most = now if most is None else most
    per = cfg.num_gpus_per_actor if cfg.num_gpus_per_actor is not None else (1.0 if float(most.get("GPU", 0)) >= 1 else 0.0)
    need = {"GPU": per} if per > 0 else {"CPU": float(cfg.torch_threads)}
    lo = pool_range(need, now, fixed=cfg.num_actors, work=units)[1]
    hi = pool_range(need, now, most, fixed=cfg.num_actors, work=units)[1]
    return (min(lo, hi), hi), (per if per > 0 else 0.0)


def relaying(actor_cls):
    """``actor_cls`` taking one more constructor argument, ``progress_queue``: where its texts counter goes."""
    def __init__(self, *args, progress_queue=None, **kwargs):
        progress.relay(progress_queue)
        actor_cls.__init__(self, *args, **kwargs)

    return type(actor_cls.__name__, (actor_cls,), {"__init__": __init__})


def run_units(units: list[dict], actor_cls, constructor_kwargs: dict, pool: tuple[int, int], gpus: float, threads: int,
              desc: str, show_progress: bool = True, run: RunDir | None = None) -> tuple[int, set[str], int]:
    """Send work units to a Ray Data pool of ``actor_cls`` (``pool``: (min, max) actors, `actor_pool_size`; one unit per
    call; each call returns rows, bytes read and node per unit). Progress: texts as the actors encode them (a bar, or
    a log line every 25 s; ``run``'s ``_progress.json``).

    Shared by the encode stage and batch embedding. Returns (rows done, ids of the nodes that did them, bytes the
    units read from their shards).
    """
    import ray

    rows_done, nodes, bytes_read = 0, set(), 0
    if not units:
        return rows_done, nodes, bytes_read
    with progress.View(desc, "text", sum(u["stop"] - u["start"] for u in units), kind="texts", run=run, stage=desc, remote=True,
                       show=show_progress) as view:
        ds = ray.data.from_items(units, override_num_blocks=len(units)).map_batches(
            relaying(actor_cls),
            fn_constructor_kwargs={**constructor_kwargs, "progress_queue": view.queue},
            compute=ray.data.ActorPoolStrategy(min_size=pool[0], max_size=pool[1]),
            batch_size=1,
            num_gpus=gpus or None,
            num_cpus=0 if gpus else threads,
        )
        for row in ds.iter_rows():
            rows_done += int(row["rows"])
            view.floor = rows_done  # whole units: what the view shows even where the actors' counters do not arrive
            bytes_read += int(row["bytes"])
            nodes.add(str(row["node"]))
    return rows_done, nodes, bytes_read
