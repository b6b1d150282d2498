"""The run directory: every stage reads its inputs from here and writes its outputs and a manifest here.

A run lives under one root, a local path or any URI that pyarrow understands (``s3://``, ``gs://``,
``hdfs://``) or that fsspec understands (wrapped through ``pyarrow.fs.FSSpecHandler``). Layout:

    <root>/config.yaml                   the last config used
    <root>/<stage>/...                   a stage's outputs (Parquet, JSON, PNG)
    <root>/<stage>/_manifest.json        written last, only when the stage finished
    <root>/<stage>/_attempts.json        the seconds of its attempts that ended unfinished, until it finishes
    <root>/llm/ledger/<stage>/...        every LLM call (see cqg_ray.llm.ledger)

The stages and what each reads are in ``cqg_ray.stages``. A stage is *done* when its manifest exists and both
its config hash and the fingerprints of the stages it read match; *stale* when the manifest exists but either
changed (so a config change re-runs the stage and, through the fingerprints, everything downstream); *missing*
otherwise.
A stage killed midway has no manifest, so it runs again (expensive stages resume inside, shard by shard); a finished
stage whose rerun a ValueError refuses (a config value, a corpus path) before it writes anything keeps its manifest."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import platform
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cqg_ray import stages

log = logging.getLogger("cqg_ray")

MANIFEST = "_manifest.json"
EMBED_RERUN = ("then run the same `cqg-ray embed ...` command: it writes the missing units again and keeps the others "
               "(--force redoes them all)")  # how an embed output's missing or damaged units are written again
ATTEMPTS = "_attempts.json"  # in a stage's folder: the seconds of its attempts that ended without finishing (a kill -9: none)


class ArtifactError(RuntimeError):
    """A missing or corrupt artifact in the run directory."""


class StageMismatch(ArtifactError):
    """A finished stage's folder no longer matches its manifest (files or rows added, removed or changed)."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


def redo_hint(stage: str) -> str:
    if not stage:  # the output folder of `cqg-ray embed`: its units are written one by one, so only those are redone
        return f"redo the changed units: delete the folder's _manifest.json (and any unit file that does not belong), {EMBED_RERUN}"
    command = getattr(stages.find(stage), "command", stage)
    return f"redo it: `cqg-ray run --force {command}` (or `cqg-ray {command} --force`)"


def documents_digest(doc_ids: Iterable[str]) -> str:
    """An order-independent digest of a set of document ids (the sum of their 64-bit blake2b hashes, and the count)."""
    total, n = 0, 0
    for d in doc_ids:
        total += int.from_bytes(hashlib.blake2b(str(d).encode(), digest_size=8).digest(), "big")
        n += 1
    return f"{n}:{total % (1 << 64):016x}"


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local path or URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(uri)
        except (ImportError, ValueError) as missing:  # nor fsspec (no driver, no such protocol): pyarrow's reason too
            raise ArtifactError(f"cannot open {uri}: {e}; {missing}") from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _hash(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


# module name in a manifest -> its distributions (the first one installed counts)
VERSIONED = {"cqg_ray": ("cqg-ray",), "ray": ("ray",), "torch": ("torch",), "numpy": ("numpy",), "pyarrow": ("pyarrow",),
             "faiss": ("faiss-cpu", "faiss-gpu", "faiss"), "sentence_transformers": ("sentence-transformers",)}


def versions() -> dict[str, str]:
    """Python's and the main packages' versions, from the installed distributions' metadata (importing them would
    cost seconds: sentence-transformers alone ~4.5 s)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for mod, dists in VERSIONED.items():
        for dist in dists:
            try:
                out[mod] = version(dist)
                break
            except PackageNotFoundError:
                pass
        else:  # not installed as a distribution (a source checkout on sys.path): the module's own, if imported
            if (m := sys.modules.get(mod)) is not None:
                out[mod] = str(getattr(m, "__version__", "?"))
    return out


@dataclass
class StageState:
    stage: str
    state: str  # done | stale | missing | changed (done, but its folder no longer matches its manifest)
    reason: str = ""
    manifest: dict | None = None


@dataclass
class StageContext:
    """Handed to a stage function: where to write, and a place for counts."""

    run: "RunDir"
    stage: str
    counts: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return self.run.uri(self.stage)


MANIFEST_TYPES = {"stage": str, "config_hash": str, "fingerprint": str, "inputs": dict, "counts": dict, "seconds": (int, float),
                  "outputs": dict}  # what readers of a manifest rely on
WARNED_MANIFESTS: set[tuple[str, str]] = set()  # (manifest, why) said once a process


def manifest_problem(m: Any) -> str | None:
    """Why ``m`` is not a stage manifest as ``write_manifest`` writes one (a field of another type), or None."""
    if not isinstance(m, dict):
        return f"a JSON {type(m).__name__}, not an object"
    for key, kind in MANIFEST_TYPES.items():
        if key in m and (not isinstance(m[key], kind) or isinstance(m[key], bool)):
            return f"{key} is {type(m[key]).__name__}"
    rows = (m.get("outputs") or {}).get("parquet_rows")
    if rows is not None and not (isinstance(rows, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in rows.values())):
        return "outputs.parquet_rows is not a mapping of row counts"
    return None


class RunDir:
    def __init__(self, root: str):
        self.root_uri = root.rstrip("/")
        self.fs, self.root = resolve(self.root_uri)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self._verified: dict[str, str] = {}  # stage -> the manifest fingerprint its folder was last checked against

    # ------------------------------------------------------------------ paths
    def path(self, *parts: str) -> str:
        """Path inside this run's filesystem."""
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def uri(self, *parts: str) -> str:
        """Full URI (what Ray Data and other libraries take)."""
        if self.local:
            return self.path(*parts)
        return "/".join([self.root_uri, *[p.strip("/") for p in parts if p]])

    # ------------------------------------------------------------------ file helpers
    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def ls(self, *parts: str, suffix: str = "") -> list[str]:
        """Sorted names (not paths) of the files directly inside a folder; [] when it does not exist."""
        sel = pafs.FileSelector(self.path(*parts), allow_not_found=True, recursive=False)
        names = [os.path.basename(i.path) for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File]
        return sorted(n for n in names if n.endswith(suffix))

    def rm(self, *parts: str) -> None:
        p = self.path(*parts)
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(p)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(p)

    def files(self, *parts: str) -> dict[str, tuple[int, int | None]]:
        """Every file below a folder but manifests, as {relative path: (size, mtime in ns)}: whether anything was written."""
        sel = pafs.FileSelector(self.path(*parts), allow_not_found=True, recursive=True)
        return {i.path: (i.size, i.mtime_ns) for i in self.fs.get_file_info(sel)
                if i.type == pafs.FileType.File and os.path.basename(i.path) not in (MANIFEST, ATTEMPTS)}

    def remove_partial(self, *parts: str) -> None:
        """Delete the temp files of writes (``write_bytes``) that a kill interrupted, directly inside a folder."""
        for name in self.ls(*parts):
            if ".tmp-" in name:
                self.rm(*parts, name)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write atomically where the filesystem allows (temp file + rename on local disks; ``remove_partial``
        deletes what a kill leaves)."""
        p = self.path(rel)
        self.fs.create_dir(os.path.dirname(p), recursive=True)
        if self.local:
            tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, p)
        else:  # object stores: a single PUT is atomic
            with self.fs.open_output_stream(p) as f:
                f.write(data)

    def write_tables(self, rel: str, schema: pa.Schema, tables: Iterable[pa.Table]) -> int:
        """One Parquet file of ``tables`` (each cast to ``schema``), streamed one table at a time, written atomically as
        ``write_bytes`` writes; returns its rows."""
        p = self.path(rel)
        self.fs.create_dir(os.path.dirname(p), recursive=True)
        tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}" if self.local else p  # object stores: one multipart upload
        rows = 0
        with self.fs.open_output_stream(tmp) as f, pq.ParquetWriter(f, schema, write_page_checksum=True) as w:
            for t in tables:
                w.write_table(t.cast(schema))
                rows += t.num_rows
        if tmp != p:
            self.fs.move(tmp, p)
        return rows

    def read_bytes(self, rel: str) -> bytes:
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            raise ArtifactError(f"missing artifact: {self.uri(rel)}") from None
        except OSError as e:  # a folder where a file belongs, no permission
            raise ArtifactError(f"cannot read {self.uri(rel)}: {e}") from None

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=False, default=str).encode())

    def read_json(self, rel: str) -> Any:
        data = self.read_bytes(rel)
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise ArtifactError(f"corrupt JSON artifact {self.uri(rel)}: {e}") from None

    def write_table(self, rel: str, table: pa.Table, row_group_size: int | None = None) -> None:  # each page with its CRC, which read_table checks
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=row_group_size, write_page_checksum=True)
        self.write_bytes(rel, buf.getvalue())

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """One Parquet file or every *.parquet file of a folder (by name); a page failing its CRC is a corrupt artifact."""
        p = self.path(rel)
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            raise ArtifactError(f"missing artifact: {self.uri(rel)}")
        try:
            if info.type == pafs.FileType.Directory:
                files = [self.path(rel, n) for n in self.ls(rel, suffix=".parquet")]
                if not files:
                    raise ArtifactError(f"no Parquet files in {self.uri(rel)}")
                tables = [pq.read_table(f, filesystem=self.fs, columns=columns, page_checksum_verification=True) for f in files]
                return pa.concat_tables(tables, promote_options="default")
            return pq.read_table(p, filesystem=self.fs, columns=columns, page_checksum_verification=True)
        except (pa.ArrowInvalid, OSError) as e:
            raise ArtifactError(f"corrupt Parquet artifact {self.uri(rel)}: {e}") from None

    # ------------------------------------------------------------------ manifests
    def manifest(self, stage: str) -> dict | None:
        """The stage's manifest; None (the stage is not done) when none was written or it is torn or of another shape."""
        if not self.exists(stage, MANIFEST):
            return None
        try:
            m = self.read_json(f"{stage}/{MANIFEST}")
        except ArtifactError:
            return None
        if (wrong := manifest_problem(m)) and (self.uri(stage, MANIFEST), wrong) not in WARNED_MANIFESTS:  # once, not per reader
            WARNED_MANIFESTS.add((self.uri(stage, MANIFEST), wrong))
            log.warning("%s is not a stage manifest (%s): the stage counts as not done", self.uri(stage, MANIFEST), wrong)
        return None if wrong else m

    def fingerprint(self, stage: str) -> str | None:
        m = self.manifest(stage)
        return m.get("fingerprint") if m else None

    def state(self, stage: str, config_hash: str | None = None, deps: Iterable[str] | None = None) -> StageState:
        m = self.manifest(stage)
        if m is None:
            return StageState(stage, "missing", "no manifest")
        if config_hash is not None and m.get("config_hash") != config_hash:
            return StageState(stage, "stale", "config changed", m)
        for dep in deps if deps is not None else reads(stage):
            recorded = m.get("inputs", {}).get(dep)
            current = self.fingerprint(dep)
            if recorded is not None and current != recorded:
                return StageState(stage, "stale", f"input '{dep}' changed", m)
        return StageState(stage, "done", "", m)

    def parquet_rows(self, stage: str) -> dict[str, int]:
        """Rows of each Parquet file directly in a stage's folder (from the files' footers)."""
        out = {}
        for name in self.ls(stage, suffix=".parquet"):
            try:
                out[name] = pq.ParquetFile(self.path(stage, name), filesystem=self.fs).metadata.num_rows
            except (pa.ArrowInvalid, OSError) as e:
                raise ArtifactError(f"corrupt Parquet artifact {self.uri(stage, name)}: {e}") from None
        return out

    def verify(self, stage: str, manifest: dict | None = None) -> None:
        """StageMismatch when a finished stage's Parquet files (names and row counts) differ from what its manifest
        recorded; a manifest from before outputs were recorded is trusted as it is."""
        m = manifest if manifest is not None else self.manifest(stage)
        recorded = (m or {}).get("outputs", {}).get("parquet_rows")
        if recorded is None or self._verified.get(stage) == m.get("fingerprint"):  # type: ignore[union-attr]
            return
        now = self.parquet_rows(stage)
        extra, missing = sorted(set(now) - set(recorded)), sorted(set(recorded) - set(now))
        rows = sorted(n for n in set(now) & set(recorded) if now[n] != recorded[n])
        problems = []
        if extra:
            problems.append(f"{len(extra)} Parquet file(s) not in its manifest ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})")
        if missing:
            problems.append(f"{len(missing)} file(s) of its manifest missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
        for n in rows[:3]:
            problems.append(f"{n} has {now[n]:,} rows, its manifest {recorded[n]:,}")
        if problems:
            label = stage or self.root_uri
            raise StageMismatch(f"stage '{label}' in {self.uri(stage)} does not match its manifest: {'; '.join(problems)} "
                                f"({sum(now.values()):,} rows now, {sum(recorded.values()):,} when it finished). The folder was "
                                f"changed after the stage finished (two runs writing at once, or a hand edit); {redo_hint(stage)}", problems)
        self._verified[stage] = m.get("fingerprint")  # type: ignore[union-attr]

    def write_manifest(self, stage: str, config_hash: str, deps: Iterable[str], counts: dict, seconds: float, extra: dict | None = None) -> dict:
        inputs = {d: self.fingerprint(d) for d in deps}
        m = {
            "stage": stage, "config_hash": config_hash, "inputs": inputs,
            "fingerprint": _hash(stage, config_hash, inputs, counts),
            "counts": counts, "seconds": round(seconds, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": versions(),
            **(extra or {}),
            "outputs": {"parquet_rows": self.parquet_rows(stage)},
        }
        self.write_json(f"{stage}/{MANIFEST}", m)
        self._verified[stage] = m["fingerprint"]
        return m

    def invalidate(self, stage: str) -> None:
        if self.exists(stage, MANIFEST):
            self.rm(stage, MANIFEST)

    def require(self, stage: str) -> dict:
        """The manifest of a finished input stage whose folder still matches it, or a clear error."""
        m = self.manifest(stage)
        if m is None:
            command = getattr(stages.find(stage), "command", stage)
            raise ArtifactError(f"stage '{stage}' has not finished in {self.root_uri}: run `cqg-ray {command} ...` first")
        self.verify(stage, m)
        return m

    def check_documents(self, stage: str, digest: str, source: str) -> None:
        """ArtifactError when the documents a stage wrote are not the set its input stage ``source`` recorded."""
        want = (self.manifest(source) or {}).get("documents_digest")
        if want is not None and want != digest:
            n_want, n_got = int(want.split(":")[0]), int(digest.split(":")[0])
            raise ArtifactError(f"stage '{stage}' wrote {n_got:,} documents, not the {n_want:,} that '{source}' holds"
                                f"{' (the same count, other documents)' if n_want == n_got else ''}: {source}/ or {stage}/ was changed "
                                f"behind its manifest; {redo_hint(source)}, then {stage}")


def reads(stage: str) -> tuple[str, ...]:
    """The stages a stage reads (none for a name the registry does not know)."""
    s = stages.find(stage)
    return s.reads if s else ()


def hash_sections(*sections: Any) -> str:
    """Config hash of one or more config sections (pydantic models) taken together."""
    return _hash(*[s.model_dump(mode="json") if hasattr(s, "model_dump") else s for s in sections])


def _attempts(run: RunDir, stage: str, config_hash: str) -> list[float]:
    """The seconds of the stage's earlier unfinished attempts at this config ([]: none, or an unreadable note)."""
    try:
        note = run.read_json(f"{stage}/{ATTEMPTS}") if run.exists(stage, ATTEMPTS) else {}
        return [float(x) for x in note["seconds"]] if isinstance(note, dict) and note.get("config_hash") == config_hash else []
    except (ArtifactError, KeyError, TypeError, ValueError):
        return []


def run_stage(
    run: RunDir,
    stage: str,
    config_hash: str,
    fn: Callable[[StageContext], Any],
    deps: Iterable[str] | None = None,
    force: bool = False,
) -> dict:
    """Run ``fn`` unless the stage is already done for this config and these inputs; write its manifest.

    ``fn(ctx)`` writes under ``ctx.uri`` and fills ``ctx.counts``. Returns the manifest.
    """
    deps = list(reads(stage) if deps is None else deps)
    st = run.state(stage, config_hash, deps)
    if st.state == "done" and not force:
        run.verify(stage, st.manifest)  # StageMismatch when its folder was changed behind the manifest
        log.info("%s: done (skipped; manifest matches)", stage)
        return st.manifest  # type: ignore[return-value]
    for d in deps:
        run.require(d)
    if st.state == "stale":
        log.info("%s: stale (%s), running again", stage, st.reason)
    before = (st.manifest, run.files(stage) if st.manifest else None)  # a finished stage refused before it wrote anything keeps its manifest
    run.invalidate(stage)
    run.makedirs(stage)
    ctx = StageContext(run, stage)
    t0 = time.time()
    earlier = _attempts(run, stage, config_hash)
    try:
        fn(ctx)
    except BaseException as e:
        if isinstance(e, ValueError) and before[0] is not None and run.files(stage) == before[1]:  # a refusal (ConfigError,
            run.write_json(f"{stage}/{MANIFEST}", before[0])  # CorpusError, DataError) before anything was written
        else:  # interrupted or failed: its time counts in the stage's when it finishes
            with contextlib.suppress(Exception):  # a note only: never in the way of the error itself
                run.write_json(f"{stage}/{ATTEMPTS}", {"config_hash": config_hash, "seconds": [*earlier, round(time.time() - t0, 3)]})
        raise
    extra = {**(ctx.extra or {}), **({"earlier_attempts_s": earlier} if earlier else {})}
    m = run.write_manifest(stage, config_hash, deps, ctx.counts, time.time() - t0, extra or None)
    if run.exists(stage, ATTEMPTS):
        run.rm(stage, ATTEMPTS)
    log.info("%s: finished in %.1fs %s", stage, m["seconds"], ctx.counts)
    return m
