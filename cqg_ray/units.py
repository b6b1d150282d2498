"""Work units over a Ray Data actor pool, shared by the encode stage and batch embedding (`cqg-ray embed`).

A unit is a slice of rows of one Parquet shard, written as one output file ``emb-<shard>-<start>.parquet``; a rerun
skips the units whose file exists, so a killed pass resumes where it stopped and writes every row exactly once.

A unit reads only its own rows (`read_unit`): the row groups of its shard that hold them (doc_id and text column chunks),
and the shard's footer once per actor (exactly its bytes, cached), so a pass reads each row group once when the shards'
row groups end where units do (``cqg-ray embed`` writes its snapshot with row groups of ``unit_rows``). Each unit reports
the bytes it read; ``run_units`` returns their sum.

    units = pending_units(run, folder, split_units(shards, unit_rows))
    now = ray.cluster_resources()
    rows, nodes, bytes_read, unit_s = run_units(units, MyUnits, kwargs, *actor_pool_size(cfg, now, declared(now, max_cpus, max_gpus)), threads, "encode")
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray import progress
from cqg_ray.config import ConfigError, EmbedConfig, EncodeConfig
from cqg_ray.pools import node_cpus, pool_range
from cqg_ray.rundir import RunDir
from cqg_ray.token_limit import unit_metadata

log = logging.getLogger("cqg_ray")

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


def unit_whole(run: RunDir, folder: str, unit: dict) -> bool:
    """Whether a unit's file opens as Parquet and holds the unit's rows."""
    try:
        return pq.ParquetFile(run.path(folder, unit["name"]), filesystem=run.fs).metadata.num_rows == unit["stop"] - unit["start"]
    except Exception:  # truncated, or not Parquet
        return False


def pending_units(run: RunDir, folder: str, units: list[dict]) -> list[dict]:
    """The units whose file is not written yet, or is damaged (`unit_whole`: written again, not resumed); unit files of
    another plan (other unit size or inputs) and the temp files of interrupted writes are removed."""
    run.remove_partial(folder)
    have = {n for n in run.ls(folder, suffix=".parquet") if n.startswith("emb-")}
    for stray in have - {u["name"] for u in units}:
        run.rm(folder, stray)
    damaged = {u["name"] for u in units if u["name"] in have and not unit_whole(run, folder, u)}
    for name in sorted(damaged):
        log.warning("unit file %s is damaged (not Parquet, or not its rows): written again", run.path(folder, name))
        run.rm(folder, name)
    return [u for u in units if u["name"] not in have - damaged]


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
    bytes read, seconds and node per unit. Subclasses set `self.run` and define `write_unit`; those that encode set
    `self.token_encoder` (their `Encoder`) and write each unit's table through `with_token_counts`."""

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

    def write_tokens(self, name: str, doc_ids: pa.Array, chunks: list) -> None:
        """`write_unit` of a unit tokenized by the CPU stage (`TokenizeUnits`): chunks as `unpack_tokens` gives them."""
        raise NotImplementedError

    def with_token_counts(self, table: pa.Table) -> pa.Table:
        """``table`` with this unit's token-limit counts (`token_limit.unit_metadata`) in its schema metadata: what the
        encoder counted since the unit began (`__call__`), or since the last unit's table where `write_unit` is called
        directly (a bench)."""
        enc = self.token_encoder
        before = getattr(self, "_counts_before", (0, 0))
        self._counts_before = (enc.texts_counted, enc.texts_at_limit)
        return table.replace_schema_metadata({**(table.schema.metadata or {}), **unit_metadata(enc, before)})

    def __call__(self, batch: dict) -> dict:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        out = {"name": [], "rows": [], "bytes": [], "seconds": [], "node": []}
        for i, (shard, start, stop, name) in enumerate(zip(batch["shard"], batch["start"], batch["stop"], batch["name"])):
            t0 = time.time()
            before = progress.snapshot()["texts"]
            enc = getattr(self, "token_encoder", None)  # the model actors' encoder (`with_token_counts`)
            self._counts_before = (enc.texts_counted, enc.texts_at_limit) if enc is not None else (0, 0)
            if "tokens" in batch:  # read and tokenized by the CPU stage before this one
                doc_ids, chunks, digest = unpack_tokens(batch["tokens"][i])
                self._check_tokenizer(digest)
                nbytes, rows = int(batch["bytes"][i]), len(doc_ids)
                self.write_tokens(str(name), pa.array(doc_ids, pa.string()), chunks)
            else:
                table, nbytes = self.read(str(shard), int(start), int(stop))
                texts = table.column("text").to_pylist()
                rows = len(texts)
                self.write_unit(str(name), table.column("doc_id"), texts)
            progress.add(texts=max(0, rows - (progress.snapshot()["texts"] - before)))  # what the write did not count as it went
            progress.flush_relay()
            out["name"].append(name)
            out["rows"].append(rows)
            out["bytes"].append(nbytes)
            out["seconds"].append(time.time() - t0)
            out["node"].append(node)
        return {k: np.array(v) for k, v in out.items()}

    def _check_tokenizer(self, digest: str) -> None:
        """The CPU stage's tokenizer must be this actor's encoder's own (the same model files and max_seq_length)."""
        if getattr(self, "_tokenizer_digest", None) is None:
            spec = self.token_encoder.tokenizer_spec()
            self._tokenizer_digest = spec_digest(*spec) if spec else ""
        if digest != self._tokenizer_digest:
            raise RuntimeError("the tokenizing stage's tokenizer differs from this actor's encoder's (another model folder, "
                               "max_seq_length or library version on this node?): run with tokenize_stage=off")


# ----------------------------------------------------------------------------------------- the CPU tokenizing stage
def spec_digest(spec: str, settings: dict) -> str:
    """A tokenizer's identity: its spec without the truncation and padding state (which a Hugging Face tokenizer's
    calls change, and `TextTokenizer` sets from ``settings``), and the settings."""
    import hashlib
    import json

    body = {k: v for k, v in json.loads(spec).items() if k not in ("truncation", "padding")}
    return hashlib.sha256(json.dumps([body, settings], sort_keys=True).encode()).hexdigest()[:16]


def pack_tokens(doc_ids: list[str], chunks: list, digest: str) -> bytes:
    """One tokenized unit as bytes (an ``.npz``, no pickle): its doc_ids, and per chunk its rows and mini-batches, each
    (indices into the chunk's rows, token arrays as int32). `unpack_tokens` reads it back."""
    arrays = {"doc_ids": np.array(doc_ids, dtype=str), "digest": np.array(digest), "batches": np.array([len(b) for _, b in chunks], dtype=np.int64)}
    j = 0
    for c, (rows, batches) in enumerate(chunks):
        arrays[f"rows{c}"] = np.asarray(rows, dtype=np.int64)
        for idx, inputs in batches:
            arrays[f"idx{j}"] = np.asarray(idx, dtype=np.int64)
            for k, v in inputs.items():
                arrays[f"tok{j}.{k}"] = np.asarray(v, dtype=np.int32)
            j += 1
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def unpack_tokens(blob: bytes) -> tuple[list[str], list, str]:
    """(doc_ids, chunks [(rows, [(indices, {key: int64 array})])], tokenizer digest) of `pack_tokens`' bytes."""
    with np.load(io.BytesIO(bytes(blob)), allow_pickle=False) as z:
        keys = {}
        for name in z.files:
            if name.startswith("tok"):
                j, k = name[3:].split(".", 1)
                keys.setdefault(int(j), {})[k] = z[name].astype(np.int64)
        chunks, j = [], 0
        for c, n in enumerate(z["batches"].tolist()):
            chunks.append((z[f"rows{c}"], [(z[f"idx{j + b}"], keys[j + b]) for b in range(n)]))
            j += n
        return z["doc_ids"].tolist(), chunks, str(z["digest"])


class TokenizeUnits(UnitActor):
    """Ray Data CPU stage before the actors: reads each unit (only its row groups) and tokenizes its texts into the
    chunks and mini-batches the actors run (``plan``, the actor class's own), so an actor (a GPU) only moves tokens
    to its device and runs the model."""

    def __init__(self, run_uri: str, spec: str, settings: dict, plan, batch_size: int, st_order: bool):
        from cqg_ray.encoder_export import TextTokenizer

        self.run, self.tok, self.digest = RunDir(run_uri), TextTokenizer(spec, **settings), spec_digest(spec, settings)
        self.plan, self.batch_size, self.st_order = plan, batch_size, st_order

    def __call__(self, batch: dict) -> dict:
        out = {k: [] for k in ("shard", "start", "stop", "name", "bytes", "tokens")}
        for shard, start, stop, name in zip(batch["shard"], batch["start"], batch["stop"], batch["name"]):
            table, nbytes = self.read(str(shard), int(start), int(stop))
            texts = table.column("text").to_pylist()
            chunks = [(rows, [(idx, self.tok([texts[rows[j]] for j in idx])) for idx in batches])
                      for rows, batches in self.plan(texts, self.batch_size, self.st_order)]
            for k, v in (("shard", shard), ("start", start), ("stop", stop), ("name", name), ("bytes", nbytes)):
                out[k].append(v)
            out["tokens"].append(pack_tokens(table.column("doc_id").to_pylist(), chunks, self.digest))
        return {k: np.array(v, dtype=object) if k == "tokens" else np.array(v) for k, v in out.items()}


def actor_pool_size(cfg: EncodeConfig | EmbedConfig, now: dict, most: dict | None = None,
                    units: int | None = None, local: bool = False) -> tuple[tuple[int, int], float]:
    """((min, max) actors, GPUs per actor) from the config and the cluster (pure); the encode stage and batch embedding
    both size their pools with it (num_actors, num_gpus_per_actor, torch_threads).

    ``now``: the cluster's resources when the stage starts; ``most``: what it is declared to grow to
    (``pools.declared`` of ``ray.max_cpus`` / ``ray.max_gpus``; default ``now``). The pool starts with the actors
    that fit now and grows to those that fit ``most``, so a fixed cluster keeps a fixed pool. GPU actors (one GPU
    each unless num_gpus_per_actor says otherwise) when the cluster has or may get a GPU, else CPU actors of
    torch_threads CPUs; a configured num_actors fixes both ends. With ``units``, at most one actor per unit (at
    least one). ``local``: a Ray this process started (`pipeline.started_ray`), where no autoscaler brings the
    GPUs an actor asks for: none there and none declared is a ConfigError, where its actors would wait for ever."""
    most = now if most is None else most
    per = cfg.num_gpus_per_actor if cfg.num_gpus_per_actor is not None else (1.0 if float(most.get("GPU", 0)) >= 1 else 0.0)
    if local and per > float(most.get("GPU", 0)):  # its actors would wait for a GPU that never comes
        raise ConfigError(f"num_gpus_per_actor {per:g}: the local Ray has {float(now.get('GPU', 0)):g} GPU(s) and may grow to "
                          f"{float(most.get('GPU', 0)):g}; set it to 0 (--gpus-per-actor 0) for CPU actors")
    need = {"GPU": per} if per > 0 else {"CPU": float(cfg.torch_threads)}
    lo = pool_range(need, now, fixed=cfg.num_actors, work=units)[1]
    hi = pool_range(need, now, most, fixed=cfg.num_actors, work=units)[1]
    return (min(lo, hi), hi), (per if per > 0 else 0.0)


def actor_threads(threads: int, node_cpus: list[float], actors: int) -> int:
    """CPU threads (and Ray CPUs) for each of ``actors`` CPU actors: the most that still fit them all on the nodes'
    CPUs (``node_cpus``, one entry a node), and at least ``threads`` (the config's). A pool cut to fewer actors than
    CPUs by its units leaves cores idle at one thread an actor (the demo's 3,000 texts are one unit: one core of two)."""
    best = threads
    for t in range(threads + 1, int(max(node_cpus, default=0)) + 1):
        if sum(int(c // t) for c in node_cpus) < actors:
            break
        best = t
    return best


def pool_threads(threads: int, pool: tuple[int, int], gpus: float, tokenize: dict | None, units: int) -> int:
    """CPU threads (and Ray CPUs) per actor of a `run_units` pool of ``units`` units: `actor_threads` on the live nodes
    for CPU actors that tokenize themselves, else ``threads`` (GPU actors, actors beside a tokenizing stage, no units)."""
    if gpus or tokenize or not units:
        return threads
    return actor_threads(threads, node_cpus(), pool[1])


def relaying(actor_cls):
    """``actor_cls`` taking one more constructor argument, ``progress_queue``: where its texts counter goes."""
    def __init__(self, *args, progress_queue=None, **kwargs):
        progress.relay(progress_queue)
        actor_cls.__init__(self, *args, **kwargs)

    return type(actor_cls.__name__, (actor_cls,), {"__init__": __init__})


def run_units(units: list[dict], actor_cls, constructor_kwargs: dict, pool: tuple[int, int], gpus: float, threads: int,
              desc: str, show_progress: bool = True, run: RunDir | None = None, tokenize: dict | None = None) -> tuple[int, set[str], int, float]:
    """Send work units to a Ray Data pool of ``actor_cls`` (``pool``: (min, max) actors, `actor_pool_size`; one unit per
    call; each call returns rows, bytes read and node per unit). Progress: texts as the actors encode them (a bar, or
    a log line every 25 s; ``run``'s ``_progress.json``).

    ``tokenize`` (`tokenize_stage`'s settings): a pool of CPU actors (`TokenizeUnits`, one CPU each,
    ``tokenize["actors"]`` at most) reads and tokenizes the units first, and ``actor_cls`` gets their tokens
    (``write_tokens``) instead of texts.

    Shared by the encode stage and batch embedding. Returns (rows done, ids of the nodes that did them, bytes the
    units read from their shards, seconds the actors spent inside units: the pass's wall time less this, over the
    actors, is their start-up and their idle time).
    """
    import ray

    rows_done, nodes, bytes_read, unit_s = 0, set(), 0, 0.0
    if not units:
        return rows_done, nodes, bytes_read, unit_s
    with progress.View(desc, "text", sum(u["stop"] - u["start"] for u in units), kind="texts", run=run, stage=desc, remote=True,
                       show=show_progress) as view:
        ds = ray.data.from_items(units, override_num_blocks=len(units))
        if tokenize:
            kwargs = {k: tokenize[k] for k in ("run_uri", "spec", "settings", "batch_size", "st_order")}
            ds = ds.map_batches(TokenizeUnits, fn_constructor_kwargs={**kwargs, "plan": actor_cls.plan},
                                compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, int(tokenize["actors"]))),
                                batch_size=1, num_cpus=1)
        ds = ds.map_batches(
            relaying(actor_cls),
            fn_constructor_kwargs={**constructor_kwargs, "progress_queue": view.queue},
            # a pool of fixed size: one unit in flight per actor, so each actor starts its own (at Ray Data's default of 4
            # the first actor ready took both units of a 20k corpus, the other idle); a pool that grows keeps the default,
            # whose queued units are what its autoscaler grows on (at 1 the pool never grew: tests/test_units.py)
            compute=ray.data.ActorPoolStrategy(min_size=pool[0], max_size=pool[1],
                                               **({"max_tasks_in_flight_per_actor": 1} if pool[0] == pool[1] else {})),
            batch_size=1,
            num_gpus=gpus or None,
            num_cpus=0 if gpus else threads,
        )
        for row in ds.iter_rows():
            rows_done += int(row["rows"])
            view.floor = rows_done  # whole units: what the view shows even where the actors' counters do not arrive
            bytes_read += int(row["bytes"])
            unit_s += float(row["seconds"])
            nodes.add(str(row["node"]))
    return rows_done, nodes, bytes_read, unit_s


def room_for_tokenizing(pool: tuple[int, int], tokenize: dict | None, gpus: float, threads: int) -> tuple[int, int]:
    """The pool beside a tokenizing stage: CPU actors give up the CPUs of the stage's actors (one each); GPU actors none."""
    if not tokenize or gpus:
        return pool
    take = -(-int(tokenize["actors"]) // max(1, threads))
    return max(1, pool[0] - take), max(1, pool[1] - take)


def tokenize_stage(cfg: EncodeConfig | EmbedConfig, model: str, gpus: float, pool: tuple[int, int], run_uri: str,
                   max_seq_length: int | None = None) -> tuple[dict | None, tuple[int, int]]:
    """(the CPU tokenizing stage's settings for `run_units`, or None where the actors tokenize; the actor pool beside
    it, `room_for_tokenizing`), from ``cfg.tokenize_stage``: "on", "off" or "auto" (on with GPU actors). The tokenizer
    is the encoder's own (`Encoder.tokenizer_spec`, loaded here on the CPU), the mini-batches those of the actors'
    batch size and resolved backend; ``cfg.tokenize_actors``: CPU actors at most (default two per GPU actor of the
    pool, one beside CPU actors, whose pool gives up its CPUs)."""
    if cfg.tokenize_stage == "off" or (cfg.tokenize_stage == "auto" and not gpus):
        return None, pool
    from cqg_ray.encoder import default_batch_size, load_encoder, resolve_backend

    enc = load_encoder(model, backend="torch-float32", device="cpu", threads=1)
    if max_seq_length:
        enc.max_seq_length = max_seq_length
    spec = enc.tokenizer_spec()
    if spec is None:
        log.warning("tokenize stage: %s's tokenizer does not run alone; the actors tokenize", model)
        return None, pool
    device = "cuda" if gpus else "cpu"
    tokenize = {"spec": spec[0], "settings": spec[1], "run_uri": run_uri, "batch_size": cfg.batch_size or default_batch_size(device),
                "actors": cfg.tokenize_actors or (2 * pool[1] if gpus else 1),
                "st_order": resolve_backend(cfg.backend, device).startswith("torch")}
    pool = room_for_tokenizing(pool, tokenize, gpus, cfg.torch_threads)
    log.info("a CPU stage of up to %d actor(s) reads and tokenizes the units; %d-%d actor(s) beside it", tokenize["actors"], *pool)
    return tokenize, pool
