"""The run directory: every stage reads its inputs from here and writes its outputs and a manifest here.

A run lives under one root, a local path or any URI that pyarrow understands (``s3://``, ``gs://``,
``hdfs://``) or that fsspec understands (wrapped through ``pyarrow.fs.FSSpecHandler``). Layout:

    <root>/config.yaml                   the last config used
    <root>/<stage>/...                   a stage's outputs (Parquet, JSON, PNG)
    <root>/<stage>/_manifest.json        written last, only when the stage finished
    <root>/llm/ledger/<stage>/...        every LLM call (see cqg_ray.llm.ledger)

The stages and what each reads are in ``cqg_ray.stages``. A stage is *done* when its manifest exists and both
its config hash and the fingerprints of the stages it read match; *stale* when the manifest exists but either
changed (so a config change re-runs the stage and, through the fingerprints, everything downstream); *missing*
otherwise.
A stage killed midway has no manifest, so it runs again (expensive stages resume inside, shard by shard).
"""

from __future__ import annotations

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


class ArtifactError(RuntimeError):
    """A missing or corrupt artifact in the run directory."""


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local path or URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
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
    state: str  # done | stale | missing
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


class RunDir:
    def __init__(self, root: str):
        self.root_uri = root.rstrip("/")
        self.fs, self.root = resolve(self.root_uri)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

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

    def read_bytes(self, rel: str) -> bytes:
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            raise ArtifactError(f"missing artifact: {self.uri(rel)}") from None

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=False, default=str).encode())

    def read_json(self, rel: str) -> Any:
        data = self.read_bytes(rel)
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise ArtifactError(f"corrupt JSON artifact {self.uri(rel)}: {e}") from None

    def write_table(self, rel: str, table: pa.Table) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        self.write_bytes(rel, buf.getvalue())

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """Read one Parquet file or every *.parquet file in a folder (sorted by name)."""
        p = self.path(rel)
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            raise ArtifactError(f"missing artifact: {self.uri(rel)}")
        try:
            if info.type == pafs.FileType.Directory:
                files = [self.path(rel, n) for n in self.ls(rel, suffix=".parquet")]
                if not files:
                    raise ArtifactError(f"no Parquet files in {self.uri(rel)}")
                tables = [pq.read_table(f, filesystem=self.fs, columns=columns) for f in files]
                return pa.concat_tables(tables, promote_options="default")
            return pq.read_table(p, filesystem=self.fs, columns=columns)
        except (pa.ArrowInvalid, OSError) as e:
            raise ArtifactError(f"corrupt Parquet artifact {self.uri(rel)}: {e}") from None

    # ------------------------------------------------------------------ manifests
    def manifest(self, stage: str) -> dict | None:
        if not self.exists(stage, MANIFEST):
            return None
        try:
            return self.read_json(f"{stage}/{MANIFEST}")
        except ArtifactError:
            return None  # a corrupt manifest means the stage is not done

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

    def write_manifest(self, stage: str, config_hash: str, deps: Iterable[str], counts: dict, seconds: float, extra: dict | None = None) -> dict:
        inputs = {d: self.fingerprint(d) for d in deps}
        m = {
            "stage": stage,
            "config_hash": config_hash,
            "inputs": inputs,
            "fingerprint": _hash(stage, config_hash, inputs, counts),
            "counts": counts,
            "seconds": round(seconds, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": versions(),
            **(extra or {}),
        }
        self.write_json(f"{stage}/{MANIFEST}", m)
        return m

    def invalidate(self, stage: str) -> None:
        if self.exists(stage, MANIFEST):
            self.rm(stage, MANIFEST)

    def require(self, stage: str) -> dict:
        """The manifest of a finished input stage, or a clear error."""
        m = self.manifest(stage)
        if m is None:
            command = getattr(stages.find(stage), "command", stage)
            raise ArtifactError(f"stage '{stage}' has not finished in {self.root_uri}: run `cqg-ray {command} ...` first")
        return m


def reads(stage: str) -> tuple[str, ...]:
    """The stages a stage reads (none for a name the registry does not know)."""
    s = stages.find(stage)
    return s.reads if s else ()


def hash_sections(*sections: Any) -> str:
    """Config hash of one or more config sections (pydantic models) taken together."""
    return _hash(*[s.model_dump(mode="json") if hasattr(s, "model_dump") else s for s in sections])


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
        log.info("%s: done (skipped; manifest matches)", stage)
        return st.manifest  # type: ignore[return-value]
    for d in deps:
        run.require(d)
    if st.state == "stale":
        log.info("%s: stale (%s), running again", stage, st.reason)
    run.invalidate(stage)
    run.makedirs(stage)
    ctx = StageContext(run, stage)
    t0 = time.time()
    fn(ctx)
    m = run.write_manifest(stage, config_hash, deps, ctx.counts, time.time() - t0, ctx.extra or None)
    log.info("%s: finished in %.1fs %s", stage, m["seconds"], ctx.counts)
    return m


def status_table(run: RunDir, config_hashes: dict[str, str] | None = None) -> list[dict]:
    """One row per stage: state, reason, counts, seconds. With ``config_hashes`` (stage -> hash of the current
    config) a stage whose config changed is stale."""
    rows = []
    for s in stages.STAGES:
        st = run.state(s.name, (config_hashes or {}).get(s.name), s.reads)
        m = st.manifest or {}
        rows.append({"stage": s.name, "state": st.state, "reason": st.reason, "counts": m.get("counts", {}), "seconds": m.get("seconds")})
    return rows


def format_status(run: RunDir, config_hashes: dict[str, str] | None = None) -> str:
    """The table `cqg-ray status` prints: one line per stage (state, seconds, the first counts, why stale)."""
    lines = [f"run: {run.root_uri}", f"{'stage':<12} {'state':<8} {'seconds':>9}  counts"]
    for r in status_table(run, config_hashes):
        counts = ", ".join(f"{k}={v}" for k, v in list(r["counts"].items())[:6])
        secs = f"{r['seconds']:.1f}" if r["seconds"] is not None else "-"
        stale = f"  ({r['reason']})" if r["state"] == "stale" else ""
        lines.append(f"{r['stage']:<12} {r['state']:<8} {secs:>9}  {counts}{stale}")
    return "\n".join(lines)
