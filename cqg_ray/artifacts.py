"""What the stages exchange, read back: one reader per artifact, so a stage depends on files, never on another stage.

Run directory (each reader first checks that the writing stage finished, naming the command to run if not):

    prepare/    corpus_shards, load_corpus, load_texts     doc_id, text, ... Parquet shards sorted by doc_id
    encode/     embedding_files, embedding_batches, load_doc_ids, load_embeddings    doc_id, embedding (fixed_size_list<float>[d])
    cluster/    Clusters.load (labels, neighbours, sizes aligned to sorted doc ids), ClusterIndex (members per cluster)
    questions/  load_questions                            question_id, text, cluster, quality, ... best quality first
                load_question_embeddings                  question_id, embedding: the questions by the run's encoder
    labels/     load_labels                               doc_id, question_id, answer, p_yes, source
    model/      model_path                                the folder that ``InterpretableEmbedder.load`` reads

Output folder of `cqg-ray embed` (OUT, no run directory around it):

    OUT/_manifest.json, OUT/emb-*.parquet, OUT/_corpus/   read_embed_output, embed_output_files, embed_output_texts

The pure helpers (``ClusterIndex``, ``add_digests``, ``embedding_matrix``, ``embeddings_table``, ``sparse_table``, ``sparse_matrix``) take and
return numpy / Arrow.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cqg_ray.rundir import EMBED_RERUN, ArtifactError, RunDir

# ----------------------------------------------------------------------------------------- pure helpers


def embeddings_table(doc_ids, emb: np.ndarray) -> pa.Table:
    """doc_id (string) + embedding (fixed_size_list of the rows of ``emb``, in its dtype)."""
    emb = np.ascontiguousarray(emb)
    values = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    return pa.table({"doc_id": pa.array(doc_ids, pa.string()), "embedding": values})


def add_digests(digests) -> str:
    """The documents digest (``rundir.documents_digest``) of the union of disjoint sets of documents, from theirs: the
    counts and the 64-bit sums add, so workers digest their own rows and the driver holds one string per part."""
    total, n = 0, 0
    for d in digests:
        count, value = d.split(":")
        n += int(count)
        total += int(value, 16)
    return f"{n}:{total % (1 << 64):016x}"


def embedding_matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(n, width) numpy array of a fixed_size_list column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, arr.type.list_size)


def sparse_table(doc_ids, X, m: int) -> pa.Table:
    """doc_id, indices list<uint16>, values list<float16> of a sparse (n, m) matrix (columns sorted per row)."""
    import scipy.sparse as sp

    if m > 65_536:
        raise ValueError(f"sparse output stores question indices as uint16: m={m} is too large")
    X = sp.csr_array(X)
    if X.shape[1] != m:
        raise ValueError(f"sparse embeddings must have m={m} columns, got {X.shape[1]}")
    X.sort_indices()
    offsets = pa.array(X.indptr.astype(np.int32))
    indices = pa.ListArray.from_arrays(offsets, pa.array(X.indices.astype(np.uint16)))
    values = pa.ListArray.from_arrays(offsets, pa.array(X.data.astype(np.float16)))
    return pa.table({"doc_id": pa.array(doc_ids, pa.string()), "indices": indices, "values": values})


def sparse_matrix(table: pa.Table, m: int):
    """The ``scipy.sparse.csr_array`` (n, m) float32 of a table with indices / values list columns."""
    import scipy.sparse as sp

    ind = table.column("indices").combine_chunks()
    val = table.column("values").combine_chunks()
    indptr = ind.offsets.to_numpy().astype(np.int64)
    indptr -= indptr[0]
    return sp.csr_array((val.flatten().to_numpy(zero_copy_only=False).astype(np.float32),
                         ind.flatten().to_numpy(zero_copy_only=False).astype(np.int32), indptr), shape=(len(table), m))


def texts_by_id(files: list[str], doc_ids, fs) -> dict[str, str]:
    """Texts of the given documents from Parquet files with doc_id and text columns, read one file at a time."""
    wanted = sorted(set(np.asarray(doc_ids, dtype=object).tolist()))
    out: dict[str, str] = {}
    if not wanted:
        return out
    value_set = pa.array(wanted, pa.string())
    for f in files:
        t = pq.read_table(f, columns=["doc_id", "text"], filesystem=fs)
        t = t.filter(pc.is_in(t.column("doc_id"), value_set=value_set))
        out.update(zip(t.column("doc_id").to_pylist(), t.column("text").to_pylist()))
    return out


@dataclass
class ClusterIndex:
    """Documents grouped by cluster: ``members(c)`` are the document indices of cluster c.

    ``build(labels, k)``: members in index order; ``build(labels, k, rng)``: in a random order drawn from ``rng``
    (one ``rng.random(n)`` call). Labels of -1 (no cluster) belong to no cluster.
    """

    order: np.ndarray
    starts: np.ndarray
    labels: np.ndarray

    @classmethod
    def build(cls, labels: np.ndarray, k: int | None = None, rng: np.random.Generator | None = None) -> "ClusterIndex":
        labels = np.asarray(labels)
        k = int(labels.max()) + 1 if k is None else k
        order = np.argsort(labels, kind="stable") if rng is None else np.lexsort((rng.random(len(labels)), labels))
        starts = np.searchsorted(labels[order], np.arange(k + 1))
        return cls(order, starts, labels)

    @property
    def k(self) -> int:
        return len(self.starts) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    def members(self, c: int) -> np.ndarray:
        return self.order[self.starts[c]: self.starts[c + 1]]

    def size(self, c: int) -> int:
        return int(self.starts[c + 1] - self.starts[c])


# ----------------------------------------------------------------------------------------- prepare/


def corpus_shards(run: RunDir) -> list[str]:
    """Paths (inside run.fs) of the corpus shards, in order."""
    run.require("prepare")
    return [run.path("prepare", n) for n in run.ls("prepare", suffix=".parquet")]


def corpus_texts(run: RunDir) -> Iterator[str]:
    """Every text of the prepared corpus, shard by shard (one shard in memory at a time)."""
    for f in corpus_shards(run):
        yield from pq.read_table(f, columns=["text"], filesystem=run.fs).column("text").to_pylist()


def load_corpus(run: RunDir, columns: list[str] | None = None) -> pa.Table:
    """The whole prepared corpus (sorted by doc_id)."""
    run.require("prepare")
    cols = None if columns is None else list(dict.fromkeys(["doc_id", *columns]))
    table = run.read_table("prepare", columns=cols).sort_by("doc_id")
    return table if columns is None else table.select(columns)


def load_texts(run: RunDir, doc_ids) -> dict[str, str]:
    """{doc_id: text} of the given documents, streamed shard by shard (never the whole corpus in memory)."""
    return texts_by_id(corpus_shards(run), doc_ids, run.fs)


# ----------------------------------------------------------------------------------------- encode/


def embedding_files(run: RunDir) -> list[str]:
    """Paths (inside run.fs) of the encode stage's embedding files."""
    run.require("encode")
    return [run.path("encode", n) for n in run.ls("encode", suffix=".parquet")]


def embedding_batches(paths: list[str], fs, rows: int) -> Iterator[pa.Table]:
    """``doc_id`` and ``embedding`` of encode/ files (paths inside ``fs``), ``rows`` rows at a time, file by file; a
    file without rows gives one empty table of its schema."""
    for path in paths:
        f = pq.ParquetFile(path, filesystem=fs, page_checksum_verification=True)
        empty = True
        try:
            for b in f.iter_batches(batch_size=rows, columns=["doc_id", "embedding"]):
                empty = False
                yield pa.Table.from_batches([b])
        except (pa.ArrowInvalid, OSError) as e:  # a page failing its CRC: damaged in place
            raise ArtifactError(f"corrupt Parquet artifact {path}: {e}") from None
        if empty:
            yield f.schema_arrow.empty_table().select(["doc_id", "embedding"])


def load_embeddings(run: RunDir, doc_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """(doc_ids, embeddings float32) sorted by doc_id; only the given ids when ``doc_ids`` is set.

    Read one file at a time into one (n, d) array: the wanted rows once, never a copy of the whole. A row's place is
    its id's position in the sorted wanted ids (a binary search, nothing rebuilt per file)."""
    wanted = np.unique(np.asarray(load_doc_ids(run) if doc_ids is None else doc_ids, dtype=object))
    out, seen = None, np.zeros(len(wanted), np.int64)
    for f in embedding_files(run):
        t = pq.read_table(f, filesystem=run.fs)
        ids = t.column("doc_id").to_numpy(zero_copy_only=False)
        pos = np.minimum(np.searchsorted(wanted, ids), max(len(wanted) - 1, 0))
        hit = wanted[pos] == ids if len(wanted) else np.zeros(len(ids), bool)
        if not hit.all():
            t, pos = t.filter(pa.array(hit)), pos[hit]
        if out is None:
            out = np.empty((len(wanted), t.schema.field("embedding").type.list_size), np.float32)
        out[pos] = embedding_matrix(t.column("embedding"))
        np.add.at(seen, pos, 1)
    missing, extra = int((seen == 0).sum()), int(seen.sum() - (seen > 0).sum())
    if missing or extra:
        what = (f"embeddings missing for {missing:,} of {len(wanted):,} requested documents" if missing else
                f"{extra:,} documents embedded more than once")
        raise ArtifactError(f"{run.uri('encode')}: {what}; redo it: `cqg-ray run --force encode` (or `cqg-ray encode --force`)")
    return wanted, out if out is not None else np.zeros((0, 0), np.float32)


def load_doc_ids(run: RunDir) -> np.ndarray:
    """Every embedded document id, sorted."""
    ids = [pq.read_table(f, columns=["doc_id"], filesystem=run.fs).column("doc_id").to_numpy(zero_copy_only=False) for f in embedding_files(run)]
    return np.sort(np.concatenate(ids))


# ----------------------------------------------------------------------------------------- cluster/


class Clusters:
    """The cluster stage's output aligned to sorted doc ids: ``doc_ids`` an Arrow string array (a text's id is
    ``doc_ids[i]``, several ``doc_ids.take(rows)``; ~20 bytes an id, where Python strings take ~75), ``labels``,
    ``neighbors`` and ``sizes`` numpy arrays."""

    def __init__(self, doc_ids: pa.Array, labels: np.ndarray, neighbors: np.ndarray, sizes: np.ndarray):
        self.doc_ids, self.labels, self.neighbors, self.sizes = doc_ids, labels, neighbors, sizes

    @property
    def k(self) -> int:
        return len(self.sizes)

    def index(self) -> ClusterIndex:
        return ClusterIndex.build(self.labels, self.k)

    @classmethod
    def load(cls, run: RunDir) -> "Clusters":
        run.require("cluster")
        a = run.read_table("cluster/assignments.parquet", columns=["doc_id", "cluster"])
        nb = run.read_table("cluster/neighbors.parquet").sort_by("cluster")
        neighbors = np.array(nb.column("neighbors").to_pylist(), dtype=np.int32).reshape(nb.num_rows, -1)
        labels = a.column("cluster").to_numpy()
        if labels.max(initial=-1) >= nb.num_rows:
            raise ArtifactError(f"{run.uri('cluster')}: assignments name a cluster that neighbors.parquet lacks")
        return cls(a.column("doc_id").combine_chunks(), labels, neighbors, nb.column("size").to_numpy())


def run_config_text(run: RunDir) -> tuple[str, str]:
    """(text, URI) of the run directory's config.yaml, as ``config.load_config`` and ``config_data`` take them; a
    ConfigError naming it when it is not UTF-8 (ArtifactError when it cannot be read)."""
    from cqg_ray.config import ConfigError

    uri = run.uri("config.yaml")
    try:
        return run.read_bytes("config.yaml").decode("utf-8"), uri
    except UnicodeDecodeError as e:
        raise ConfigError(f"{uri} is not UTF-8 text (byte {e.start})") from None


# ----------------------------------------------------------------------------------------- questions/, labels/, model/


def read_with(run: RunDir, rel: str, needed: tuple[str, ...]) -> pa.Table:
    """``run.read_table(rel)``, an ArtifactError naming the file when it lacks a column its readers need (another
    table in its place)."""
    table = run.read_table(rel)
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{run.uri(rel)} lacks the column(s) {', '.join(missing)} (it has {', '.join(table.column_names)}): "
                            f"not this stage's table")
    return table


def load_questions(run: RunDir) -> pa.Table:
    """The selected questions, by question_id (0..m-1, best quality first)."""
    run.require("questions")
    return read_with(run, "questions/questions.parquet", ("question_id", "text")).sort_by("question_id")


QUESTION_EMBEDDINGS = "questions/embeddings.parquet"


def question_embeddings_table(emb: np.ndarray, encoder: str, backend: str) -> pa.Table:
    """question_id (int32, 0..m-1) + embedding (fixed_size_list<float32>[d]), the encoder that made them in the schema's
    metadata."""
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    values = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
    t = pa.table({"question_id": pa.array(np.arange(len(emb)), pa.int32()), "embedding": values})
    return t.replace_schema_metadata({"encoder": encoder, "backend": backend})


def load_question_embeddings(run: RunDir, encoder: str, backend: str, m: int) -> np.ndarray | None:
    """The (m, d) float32 embeddings the questions stage made of its m selected questions, by question_id; None where it
    made none (a run of an earlier version), or made them with another encoder or backend than the one named."""
    if not run.exists(QUESTION_EMBEDDINGS):
        return None
    t = read_with(run, QUESTION_EMBEDDINGS, ("question_id", "embedding"))
    meta = t.schema.metadata or {}
    if (meta.get(b"encoder", b"").decode(), meta.get(b"backend", b"").decode()) != (encoder, backend):
        return None
    ids = t.column("question_id").to_numpy()
    if not np.array_equal(np.sort(ids), np.arange(m)):
        raise ArtifactError(f"{run.uri(QUESTION_EMBEDDINGS)} holds question ids {ids.min() if len(ids) else '-'}..{ids.max() if len(ids) else '-'} "
                            f"({len(ids)} rows) where questions.parquet has 0..{m - 1}; redo it: `cqg-ray run --force questions`")
    emb = embedding_matrix(t.column("embedding")).astype(np.float32, copy=False)
    return emb[np.argsort(ids)]


def load_labels(run: RunDir) -> pa.Table:
    """The LLM's answers: doc_id, question_id, answer, p_yes, source."""
    run.require("labels")
    return read_with(run, "labels/labels.parquet", ("doc_id", "question_id", "answer"))


def model_path(run: RunDir) -> str:
    """The URI of the run's model folder."""
    run.require("model")
    return run.uri("model")


# ----------------------------------------------------------------------------------------- output of `cqg-ray embed`

EMBED_FORMAT = "cqg-ray-embeddings"
EMBED_META_KEY = b"cqg_ray.embed"  # Parquet schema metadata: format, m, output, tau
EMBED_CORPUS = "_corpus"
EMBED_SETTINGS = "_settings.json"
EMBED_MANIFEST = "_manifest.json"


def embed_table_meta(schema: pa.Schema) -> dict:
    """The self-describing metadata (format, m, output, tau) of one embed output file."""
    raw = (schema.metadata or {}).get(EMBED_META_KEY)
    if raw is None:
        raise ArtifactError("not a cqg-ray embeddings file (no cqg_ray.embed metadata); make one with `cqg-ray embed`")
    return json.loads(raw)


FINGERPRINT_FILES = ("config.json", "questions.json", "heads.safetensors")  # what embeddings depend on (the budget too)
HEADS_FILES = ("questions.json", "heads.safetensors")  # what answers a query the same way, whatever its budget


def model_fingerprint(model_path: str, names: tuple[str, ...] = FINGERPRINT_FILES) -> str:
    """sha256 (16 hex digits) of the model folder's files ``names``: by default what the embeddings depend on."""
    import hashlib

    run = RunDir(model_path)
    h = hashlib.sha256()
    for name in names:
        h.update(run.read_bytes(name))
    return h.hexdigest()[:16]


def not_a_run(run: RunDir) -> str | None:
    """What a path given as a run directory is instead (no such folder, a file, a model folder, an embed output), or None."""
    kind = run.fs.get_file_info(run.root).type
    if kind != pafs.FileType.Directory:
        return "no such folder" if kind == pafs.FileType.NotFound else "a file"
    if run.exists(EMBED_SETTINGS):  # (its _lease.lock is no sign of a run)
        return f"an output of cqg-ray embed ({EMBED_SETTINGS})"
    return "a model folder (config.json)" if run.exists("config.json") and not run.exists("config.yaml") else None


def require_run_or_new(run_dir: str, flag: str) -> None:
    """ArtifactError where ``run_dir`` is a file, a model folder or an embed output: said before a lease and a config.yaml
    are written into it (a folder that does not exist yet, or an empty one, becomes a run). ``flag``: how the user gave it."""
    what = not_a_run(RunDir(run_dir))
    if what is not None and what != "no such folder":
        raise ArtifactError(f"{run_dir} is not a cqg-ray run directory ({what}): give a run directory ({flag}), "
                            "or a new folder to start one")


def file_on_path(path: str) -> str | None:
    """The file that stands where a local folder ``path`` would go, or None: ``path`` itself when it is a file, else the
    nearest existing folder above it when that is a file (``notes.txt/a/b`` -> ``notes.txt``), named as ``path`` names
    it. What a command writing a folder checks before any work (making it would fail with NotADirectoryError)."""
    p = os.path.normpath(path)
    while not os.path.exists(p):
        up = os.path.dirname(p)
        if up in ("", p):
            return None
        p = up
    return None if os.path.isdir(p) else p


def embed_manifest(out: str) -> dict:
    """The manifest of a finished `cqg-ray embed` output folder; ArtifactError saying whether it is unfinished or none."""
    run = RunDir(out)
    if not run.exists():
        raise ArtifactError(f"{out}: no such folder; give the OUT folder `cqg-ray embed MODEL CORPUS OUT` wrote")
    if run.exists("config.json") and not run.exists(EMBED_SETTINGS):  # the model given twice, or in the output's place
        raise ArtifactError(f"{out} is a model folder (config.json), not an embed output; give the OUT folder "
                            "`cqg-ray embed MODEL CORPUS OUT` wrote")
    if run.exists("config.yaml") and not run.exists(EMBED_SETTINGS):  # a pipeline's run directory: embed refuses to write there
        raise ArtifactError(f"{out} is a pipeline run directory (config.yaml), not an embed output; embed a corpus into a folder "
                            "of its own (`cqg-ray embed MODEL CORPUS OUT`) and give that OUT")
    if not run.exists(EMBED_MANIFEST):
        what = "unfinished" if run.exists(EMBED_SETTINGS) else "not a cqg-ray embed output"
        raise ArtifactError(f"{out}: {what} (no {EMBED_MANIFEST}); run `cqg-ray embed MODEL CORPUS {out}` (again) first")
    return run.read_json(EMBED_MANIFEST)


def embed_output_files(out: str) -> list[str]:
    """Paths (inside the output's filesystem) of the unit files of a finished `cqg-ray embed` output folder."""
    run = RunDir(out)
    embed_manifest(out)
    run.verify("")  # StageMismatch when unit files were removed, added or changed since it finished
    return [run.path(n) for n in run.ls(suffix=".parquet") if n.startswith("emb-")]


def read_unit(run: RunDir, path: str) -> pa.Table:
    """One unit file of an embed output, its pages' checksums checked (embed writes them); ArtifactError naming the
    file and how to write it again where it does not read (a byte changed in a page read back as other values)."""
    try:
        return pq.read_table(path, filesystem=run.fs, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        raise ArtifactError(f"{run.root_uri}/{os.path.basename(path)} is damaged ({str(e).splitlines()[0][:200]}): {EMBED_REPAIR}") from None


EMBED_REPAIR = f"delete that file and the folder's _manifest.json, {EMBED_RERUN}"


def read_embed_output(out: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """(doc_ids, embeddings, manifest) of a whole output folder, in file order: packed uint8 bits, float16
    probabilities, or a ``scipy.sparse.csr_array`` of values (output sparse)."""
    run = RunDir(out)
    files = embed_output_files(out)
    tables = [read_unit(run, f) for f in files]
    meta = run.read_json(EMBED_MANIFEST)
    if meta["output"] == "sparse":
        ids = [t.column("doc_id").to_numpy(zero_copy_only=False) for t in tables]
        table = pa.concat_tables(tables) if tables else sparse_table([], np.zeros((0, meta["m"]), np.float32), meta["m"])
        return (np.concatenate(ids) if ids else np.array([], dtype=object)), sparse_matrix(table, meta["m"]), meta
    if not tables:
        width = (meta["m"] + 7) // 8 if meta["output"] == "bits" else meta["m"]
        return np.array([], dtype=object), np.zeros((0, width), np.uint8 if meta["output"] == "bits" else np.float16), meta
    table = pa.concat_tables(tables)
    return table.column("doc_id").to_numpy(zero_copy_only=False), embedding_matrix(table.column("embedding")), meta


def embed_output_texts(out: str, doc_ids) -> dict[str, str]:
    """{doc_id: text} of some documents from the output's corpus snapshot (empty when there is none)."""
    run = RunDir(out)
    return texts_by_id([run.path(EMBED_CORPUS, n) for n in run.ls(EMBED_CORPUS, suffix=".parquet")], doc_ids, run.fs)
