"""Batch embedding (`cqg-ray embed MODEL CORPUS OUT`): a trained model M = (Enc, {C_1..C_m}) over any corpus.

Two resumable Ray Data passes write everything under OUT:

    OUT/_corpus/part-<file>.parquet     1. snapshot: each input file parsed by the ingestion's readers
                                           (`cqg_ray.corpus.parse_file`) into doc_id, text, source, line; one
                                           task and one atomic file per input file, the parse tally in its metadata,
                                           row groups of `unit_rows` rows (a unit's rows are one row group)
    OUT/emb-part-<file>-<start>.parquet 2. embedding: units of at most `unit_rows` rows of one snapshot part; an
                                           actor pool (the model loaded once per actor, a GPU per actor when the
                                           cluster has GPUs) reads a unit's row group (doc_id and text only, the
                                           part's footer once per actor), embeds it and writes its file atomically
    OUT/_settings.json                  what the files depend on (model fingerprint, output, budget, encoder backend, inputs)
    OUT/_manifest.json                  written last, by `RunDir.write_manifest` (OUT is a run directory whose one
                                           stage folder is OUT itself): config hash of the settings, counts, timings,
                                           versions, format, m, output, budget, bytes per text

Output columns: doc_id (string) and, by `--output`:
- `sparse`: `indices` list<uint16> and `values` list<float16>, each text's active questions (the model's budget, or
  `--k` / `--tau`) and their values: about 4 bytes an active question;
- `bits`: `embedding`, the active questions as 0/1 over all m, packed with `np.packbits` (fixed_size_list<uint8>[ceil(m/8)]);
- `probs`: `embedding`, the probabilities sigma(C_i(Enc(t))) (fixed_size_list<float16>[m]), unbudgeted.
The Parquet schema metadata (key `cqg_ray.embed`) repeats m, the output kind and the budget, so a file describes
itself. `cqg_ray.artifacts.read_embed_output` reads a finished OUT.

Why a snapshot instead of `cqg-ray prepare`: prepare deduplicates, samples and re-shards the corpus (a training
set), but batch embedding must give every input row exactly once, in its own file's order. The snapshot keeps
every row that the readers accept (empty texts are dropped and counted, as in prepare), gives each row a fixed
place (file, row), so work units are plain row slices, and it is what `cqg-ray search` shows texts from.
Document ids: the `--id-column` when given, else sha1(file:line:text) (stable, unique per row). The units read each
row of the snapshot once: the manifest counts the bytes they read (``unit_bytes_read``, measured through the file
objects Parquet reads from) beside the snapshot's size (``snapshot_bytes``): a whole pass reads each row group's doc_id
and text chunks once and each part's footer once per actor that reads it (the source and line columns stay unread).

A killed run resumes: finished snapshot parts and unit files are skipped, half-written files never count (they are
written to a temporary name and renamed). A rerun of a finished OUT with the same settings is skipped (its manifest
matches, as for a pipeline stage). A rerun with another model, output, budget, encoder backend or other input files refuses to mix
results (use a new OUT or `--force`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.artifacts import (EMBED_CORPUS, EMBED_FORMAT, EMBED_MANIFEST, EMBED_META_KEY, EMBED_SETTINGS, HEADS_FILES, embeddings_table,
                               model_fingerprint, sparse_table)
from cqg_ray.config import CorpusConfig, EmbedConfig, RayConfig
from cqg_ray.pools import declared
from cqg_ray.token_limit import token_limit_counts, token_limit_note
from cqg_ray.units import UnitActor, actor_pool_size, limit_cpu_threads, pending_units, pool_threads, run_units, split_units, tokenize_stage
from cqg_ray.rundir import ArtifactError, RunDir, hash_sections, resolve

log = logging.getLogger("cqg_ray")

ROOT = ""  # OUT itself is the one stage folder of its run directory: OUT/_manifest.json, OUT/emb-*.parquet

# ----------------------------------------------------------------------------------------- pure core


def embed_output_table(doc_ids, emb, output: str, m: int, budget: dict, tau: float) -> pa.Table:
    """doc_id + the embedding columns, with the self-describing metadata: ``bits`` packed uint8 active questions
    (``embedding``), ``probs`` float16 probabilities (``embedding``), ``sparse`` a ``scipy.sparse`` (n, m) matrix of
    values written as ``indices`` list<uint16> and ``values`` list<float16> (the active questions of each text)."""
    if output == "bits":
        emb = np.ascontiguousarray(emb, dtype=np.uint8)
        if emb.shape[1] != (m + 7) // 8:
            raise ValueError(f"packed bits must have ceil(m/8)={(m + 7) // 8} bytes per row, got {emb.shape[1]}")
        table = embeddings_table(doc_ids, emb)
    elif output == "probs":
        emb = np.ascontiguousarray(emb, dtype=np.float16)
        if emb.shape[1] != m:
            raise ValueError(f"probabilities must have m={m} columns, got {emb.shape[1]}")
        table = embeddings_table(doc_ids, emb)
    elif output == "sparse":
        table = sparse_table(doc_ids, emb, m)
    else:
        raise ValueError(f"output must be 'bits', 'probs' or 'sparse', got {output!r}")
    meta = {EMBED_META_KEY: json.dumps({"format": EMBED_FORMAT, "m": m, "output": output, "budget": budget, "tau": tau}).encode()}
    return table.replace_schema_metadata(meta)


def part_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


# ----------------------------------------------------------------------------------------- Ray layer


def _snapshot_file(row: dict, cfg_json: str, out_uri: str, unit_rows: int) -> dict:
    """Ray Data map: parse one input file with the ingestion's readers, write its rows as one snapshot part in row
    groups of ``unit_rows`` rows (the units' boundaries: a unit reads its own row group and nothing else)."""
    from cqg_ray.corpus import parse_file, read_bytes, rows_table

    cfg = CorpusConfig.model_validate_json(cfg_json)
    res = parse_file(read_bytes(row["uri"]), row["format"], row["uri"], cfg)
    table = rows_table(res, row["name"], dedup=False).drop_columns(["text_hash"])
    tally = {"dropped": dict(res.dropped), "errors": res.errors}
    table = table.replace_schema_metadata({b"cqg_ray.parse": json.dumps(tally).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=unit_rows, write_page_checksum=True)
    RunDir(out_uri).write_bytes(f"{EMBED_CORPUS}/{row['part']}", buf.getvalue())
    return {"part": row["part"], "rows": table.num_rows}


PROGRESS_TEXTS = 256  # a CPU actor's texts between two advances of the progress counter (`InterpretableEmbedder.encode`'s
# chunk, which leaves the embeddings as they are; its default of 4,096, kept on GPUs, was minutes of no progress for long
# documents on 2 cores)


class EmbedUnits(UnitActor):
    """Ray Data actor: the model loaded once; embeds whole units and writes their files."""

    def __init__(self, model_path: str, out_uri: str, output: str, budget: dict, batch_size: int | None, threads: int,
                 backend: str = "auto"):
        limit_cpu_threads(threads)
        from cqg_ray.encoder import default_batch_size
        from cqg_ray.mbqa.embedder import CHUNK_SIZE, InterpretableEmbedder

        self.model = InterpretableEmbedder.load(model_path, backend=backend)
        self.chunk_size = PROGRESS_TEXTS if self.model.device == "cpu" else CHUNK_SIZE
        from cqg_ray.mbqa.budget import Budget

        self.budget = Budget.from_dict(budget)
        self.run = RunDir(out_uri)
        self.output, self.batch_size = output, batch_size or default_batch_size(self.model.device)
        self.token_encoder = self.model.encoder

    @staticmethod
    def plan(texts: list[str], batch_size: int, st_order: bool) -> list:
        """`write_unit`'s chunks and mini-batches (`InterpretableEmbedder.encode`'s: `chunk_plan`), for the CPU stage."""
        from cqg_ray.mbqa.embedder import chunk_plan

        return chunk_plan(texts, batch_size, st_order)

    def write_unit(self, name: str, doc_ids: pa.Array, texts: list[str]) -> None:
        budget = None if self._kind == "probs" else self.budget  # probabilities are unbudgeted (the files record the budget)
        emb = self.model.encode(texts, output=self._kind, budget=budget, batch_size=self.batch_size, progress=False,
                                chunk_size=self.chunk_size)
        self._write(name, doc_ids, emb)

    def write_tokens(self, name: str, doc_ids: pa.Array, chunks: list) -> None:
        self._write(name, doc_ids, self.model.encode_tokens(chunks, output=self._kind, budget=self.budget))

    @property
    def _kind(self) -> str:
        return "packed" if self.output == "bits" else self.output

    def _write(self, name: str, doc_ids: pa.Array, emb) -> None:
        self.run.write_table(name, self.with_token_counts(embed_output_table(doc_ids, emb, self.output, self.model.m, self.budget.to_dict(), self.model.tau)))


def _clear(run: RunDir) -> None:
    for name in run.ls(suffix=".parquet"):
        if name.startswith("emb-"):
            run.rm(name)
    for name in (EMBED_CORPUS, EMBED_SETTINGS, EMBED_MANIFEST):
        run.rm(name)


def embed(model_path: str, corpus_paths: list[str], out: str, cfg: EmbedConfig | None = None,
          corpus: CorpusConfig | None = None, force: bool = False, progress: bool = True, cluster: RayConfig | None = None,
          files: list[tuple[str, str]] | None = None) -> dict:
    """Embed every row of the corpus files with the model; returns the manifest (also written to OUT/_manifest.json).

    `corpus` chooses the readers' options (format, text/id columns, ...); its paths, dedup, limit are ignored.
    ``files``: `list_files` of the corpus paths where the caller listed them already.
    Needs Ray (started locally if nobody did). OUT and the model must be reachable from every node. The actor pool
    starts with the actors that fit the cluster now and grows to those that fit ``cluster.max_cpus`` /
    ``cluster.max_gpus`` (`units.actor_pool_size`; default: what is there).
    """
    import ray

    from cqg_ray.corpus import CorpusError, list_files, repeated_id_rows, row_places, unwrap_error
    from cqg_ray.corpus.read import KEPT_COUNTS, MAX_REPORTED_ERRORS, TSV_QUOTED_NOTE, replaced_utf8_warning
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.folder import resolve_model

    model_path = resolve_model(model_path)  # a shipped model's name -> its folder
    cfg = cfg or EmbedConfig()
    corpus = (corpus or CorpusConfig()).model_copy(update={"paths": list(corpus_paths), "dedup": False, "limit": None})
    head = InterpretableEmbedder.load(model_path, load_encoder=False, device="cpu")  # checks the folder; heads only
    budget = head.budget_for(cfg.tau, cfg.k)  # a bad model, k or tau: said before Ray starts
    if not ray.is_initialized():
        from cqg_ray.pipeline import init_ray

        init_ray(RayConfig())
    t_start = time.time()
    files = files if files is not None else list_files(corpus.paths, corpus.format)
    run = RunDir(out)
    stats = [_file_stat(u) for u, _ in files]
    settings = {
        "format": EMBED_FORMAT, "model_fingerprint": model_fingerprint(model_path), "m": head.m, "output": cfg.output, "budget": budget.to_dict(),
        "backend": cfg.backend, "unit_rows": cfg.unit_rows,
        "readers": corpus.model_dump(mode="json", exclude={"paths", "dedup", "limit", "sample_seed", "rows_per_shard"}),
        "files": [{"uri": u, "format": f, **stat} for (u, f), stat in zip(files, stats)],
    }
    if force:
        _clear(run)
    if run.exists(EMBED_SETTINGS):
        before = run.read_json(EMBED_SETTINGS)
        if before.get("files") and "mtime_ns" not in before["files"][0]:  # written before the times were recorded
            settings["files"] = [{k: v for k, v in f.items() if k != "mtime_ns"} for f in settings["files"]]
        if "backend" not in before:  # written before the encoder backend was recorded (a resume could mix backends)
            del settings["backend"]
        changed = sorted(k for k in settings if before.get(k) != settings[k]) if before != settings else []
        if changed and not any(n.startswith("emb-") for n in run.ls(suffix=".parquet")):  # nothing embedded yet: nothing to lose
            log.info("embed: %s holds no embeddings yet, only a snapshot made with other settings (%s): starting again", out, ", ".join(changed))
            _clear(run)
        elif changed:
            why = " (an input file was added, removed or changed since, or the paths were given in another order)" if "files" in changed else ""
            raise ArtifactError(f"{out} holds embeddings made with other settings ({', '.join(changed)} differ{why}): "
                                "use another OUT folder or --force to start again")
    config_hash = hash_sections(settings)
    done = run.state(ROOT, config_hash, deps=[])
    if done.state == "done":
        run.verify(ROOT, done.manifest)  # StageMismatch when OUT was changed behind its manifest
        log.info("embed: %s is done (skipped; manifest matches)", out)
        return done.manifest
    run.invalidate(ROOT)
    run.makedirs(EMBED_CORPUS)
    run.write_json(EMBED_SETTINGS, settings)
    run.remove_partial(EMBED_CORPUS)  # (OUT's own temp files: pending_units)

    # 1. snapshot of the input rows, one part per input file
    names = _relative_names([u for u, _ in files])
    items = [{"uri": u, "format": f, "name": n, "part": part_name(i)} for i, ((u, f), n) in enumerate(zip(files, names))]
    have = set(run.ls(EMBED_CORPUS, suffix=".parquet"))
    todo = [it for it in items if it["part"] not in have]
    if todo:
        try:
            ray.data.from_items(todo, override_num_blocks=len(todo)).map(
                _snapshot_file, fn_kwargs={"cfg_json": corpus.model_dump_json(), "out_uri": run.root_uri,
                                           "unit_rows": cfg.unit_rows}).take_all()
        except Exception as e:  # a CorpusError inside a Ray task arrives wrapped; give the user the plain message
            raise unwrap_error(e, CorpusError) from None
    parts = [(run.path(EMBED_CORPUS, it["part"]), pq.ParquetFile(run.path(EMBED_CORPUS, it["part"]), filesystem=run.fs)) for it in items]
    shards = [(p, f.metadata.num_rows) for p, f in parts]
    dropped: dict[str, int] = {}
    problems: list[str] = []  # the first few rows rejected, by file:line
    for _, f in parts:
        tally = json.loads((f.schema_arrow.metadata or {}).get(b"cqg_ray.parse", b"{}"))
        for k, v in tally.get("dropped", {}).items():
            dropped[k] = dropped.get(k, 0) + int(v)
        problems += tally.get("errors", [])
    for problem in problems[:MAX_REPORTED_ERRORS]:
        log.warning("embed: %s", problem)
    lost = {k: v for k, v in dropped.items() if k not in KEPT_COUNTS and v}
    if not sum(n for _, n in shards):
        raise CorpusError(f"nothing to embed in {', '.join(corpus_paths)}: no row has a text"
                          + (f" (dropped: {', '.join(f'{k} {v}' for k, v in lost.items())})" if lost else ""))
    if lost:  # counted in the manifest too; said here, so that a run that drops rows does not pass in silence
        log.warning("embed: rows not embedded: %s", ", ".join(f"{k} {v}" for k, v in lost.items()))
    if dropped.get("utf8_replaced"):  # embedded, but maybe not what the file meant (another encoding, binary)
        log.warning(replaced_utf8_warning("embed", dropped["utf8_replaced"]))
    if dropped.get("tsv_quoted"):
        log.info("embed: %d %s", dropped["tsv_quoted"], TSV_QUOTED_NOTE)
    if corpus.id_column and (rows := repeated_id_rows(run.fs, [p for p, _ in shards])):  # search and joins need one row an id
        raise CorpusError(f"document id {rows[0]['doc_id']!r} appears more than once ({row_places(rows)}): ids from --id-column "
                          f"{corpus.id_column!r} must be unique")

    # 2. embedding units
    units = split_units(shards, cfg.unit_rows)
    todo_units = pending_units(run, ROOT, units)
    cluster = cluster or RayConfig()
    now = ray.cluster_resources()
    from cqg_ray.pipeline import started_ray

    pool, gpus = actor_pool_size(cfg, now, declared(now, cluster.max_cpus, cluster.max_gpus), units=len(todo_units),
                                 local=started_ray())
    log.info("embed: %d rows in %d file(s), %d units (%d done before), m=%d, output=%s, budget %s, %d-%d actor(s) x %s GPU",
             sum(n for _, n in shards), len(files), len(units), len(units) - len(todo_units), head.m, cfg.output, budget.name, *pool, gpus)
    tokenize, pool = tokenize_stage(cfg, head.encoder_name, gpus, pool, run.root_uri) if todo_units else (None, pool)
    threads = pool_threads(cfg.torch_threads, pool, gpus, tokenize, len(todo_units))
    t0 = time.time()
    rows_now, nodes, bytes_read, unit_s = run_units(todo_units, EmbedUnits,
                                                    {"model_path": model_path, "out_uri": run.root_uri, "output": cfg.output,
                                                     "budget": budget.to_dict(), "batch_size": cfg.batch_size,
                                                     "threads": threads, "backend": cfg.backend},
                                                    pool, gpus, threads, "embed", progress, tokenize=tokenize)
    wall = time.time() - t0

    # every input row exactly once: the unit files cover the snapshot's rows one for one
    footers = {u["name"]: pq.ParquetFile(run.path(u["name"]), filesystem=run.fs).metadata for u in units}
    written = {name: meta.num_rows for name, meta in footers.items()}
    bad = [n for u in units if written[(n := u["name"])] != u["stop"] - u["start"]]
    if bad:
        raise ArtifactError(f"{out}: unit files with the wrong number of rows: {bad[:5]}; rerun with --force")
    rows = sum(written.values())
    limit = token_limit_counts(footers.values())
    if note := token_limit_note("embed", limit):
        log.info(note)
    counts = {"files": len(files), "rows": rows, "units": len(units), "units_resumed": len(units) - len(todo_units),
              "embedded_now": rows_now, "nodes_used": len(nodes), "actors": pool[1] if todo_units else 0, "tokenize_stage": bool(tokenize),
              "threads_per_actor": 0 if gpus or not todo_units else threads,
              "snapshot_bytes": sum(run.fs.get_file_info(p).size for p, _ in shards), "unit_bytes_read": bytes_read,
              "wall_s": round(wall, 2), "unit_seconds": round(unit_s, 2), **limit,
              **{KEPT_COUNTS.get(k, f"dropped_{k}"): v for k, v in dropped.items()}}
    return run.write_manifest(ROOT, config_hash, [], counts, time.time() - t_start, extra={
        "stage": "embed",
        **{k: settings[k] for k in ("format", "m", "output", "budget", "model_fingerprint")},
        "heads_fingerprint": model_fingerprint(model_path, HEADS_FILES),  # what a query must be embedded by (`cqg-ray search`)
        "tau": head.tau,
        "model": model_path,
        "corpus": list(corpus_paths),
        "bytes_per_text": (head.m + 7) // 8 if cfg.output == "bits" else 2 * head.m if cfg.output == "probs" else
                          round(column_bytes(run, [u["name"] for u in units], ("indices", "values")) / max(rows, 1), 2),
        "file_bytes_per_text": round(sum(run.fs.get_file_info(run.path(u["name"])).size for u in units) / max(rows, 1), 1),
        "columns": {"doc_id": "string", **({"embedding": f"fixed_size_list<uint8>[{(head.m + 7) // 8}] packbits"} if cfg.output == "bits" else
                    {"embedding": f"fixed_size_list<float16>[{head.m}]"} if cfg.output == "probs" else
                    {"indices": "list<uint16>", "values": "list<float16>"})},
        "texts_per_s": round(rows_now / wall, 1) if rows_now and wall > 0 else None,
    })


def column_bytes(run: RunDir, names: list[str], columns: tuple[str, ...]) -> int:
    """Bytes the given columns take in these Parquet files (compressed column chunks, from the footers)."""
    total = 0
    for name in names:
        meta = pq.ParquetFile(run.path(name), filesystem=run.fs).metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)
                         if rg.column(c).path_in_schema.split(".")[0] in columns)
    return total


def _file_stat(uri: str) -> dict:
    """An input file's size and modification time (ns): a file changed since OUT was written differs in one of them."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    return {"size": info.size, "mtime_ns": info.mtime_ns}


def _relative_names(uris: list[str]) -> list[str]:
    """File names relative to the inputs' common folder (used in the document ids, so ids survive a move of that folder;
    adding a file from another folder moves the common folder, and so every name and id)."""
    if len(uris) == 1:
        return [os.path.basename(uris[0])]
    common = os.path.commonpath([u.split("://", 1)[-1] for u in uris])
    return [os.path.relpath(u.split("://", 1)[-1], common) for u in uris]
