"""The artifact readers on hand-made run directories (no Ray), and the pure helpers they share."""

import json

import numpy as np
import pyarrow as pa
import pytest

from cqg_ray.artifacts import (
    EMBED_CORPUS,
    ClusterIndex,
    Clusters,
    corpus_shards,
    embed_output_files,
    embed_output_texts,
    embedding_matrix,
    embeddings_table,
    file_on_path,
    load_corpus,
    load_doc_ids,
    load_embeddings,
    load_labels,
    load_question_embeddings,
    load_questions,
    load_texts,
    model_path,
    question_embeddings_table,
    read_embed_output,
    texts_by_id,
)
from cqg_ray.rundir import ArtifactError, RunDir


def finish(run: RunDir, stage: str) -> None:
    run.write_manifest(stage, "h", [], {}, 0.0)


def test_cluster_index():
    labels = np.repeat(np.arange(6), [10, 10, 10, 10, 3, 40])
    idx = ClusterIndex.build(labels)
    assert idx.k == 6
    assert idx.members(4).tolist() == [40, 41, 42]
    assert idx.size(5) == 40
    assert idx.sizes.tolist() == [10, 10, 10, 10, 3, 40]


def test_cluster_index_shuffled_and_unclustered():
    labels = np.array([2, -1, 0, 2, 0, 2, -1, 0])
    idx = ClusterIndex.build(labels, k=4, rng=np.random.default_rng(0))
    assert idx.sizes.tolist() == [3, 0, 3, 0]
    assert sorted(idx.members(0).tolist()) == [2, 4, 7] and sorted(idx.members(2).tolist()) == [0, 3, 5]
    assert idx.members(1).tolist() == [] and idx.members(3).tolist() == []
    # the order inside each cluster is that of one rng.random(n) draw
    keys = np.random.default_rng(0).random(8)
    assert idx.members(2).tolist() == sorted([0, 3, 5], key=lambda i: keys[i])
    assert idx.members(0).tolist() == sorted([2, 4, 7], key=lambda i: keys[i])


def test_embeddings_table_round_trip():
    emb = np.arange(12, dtype=np.float16).reshape(3, 4)
    t = embeddings_table(["a", "b", "c"], emb)
    assert t.column_names == ["doc_id", "embedding"] and t.schema.field("embedding").type == pa.list_(pa.float16(), 4)
    back = embedding_matrix(t.column("embedding"))
    assert back.dtype == np.float16 and np.array_equal(back, emb)
    assert np.array_equal(embedding_matrix(pa.concat_tables([t, t]).column("embedding")), np.concatenate([emb, emb]))


@pytest.fixture
def run(tmp_path):
    """A run directory with every stage's files written by hand."""
    run = RunDir(str(tmp_path / "run"))
    docs = [f"d{i}" for i in range(6)]
    run.write_table("prepare/part-000000.parquet", pa.table({"doc_id": docs[:3], "text": ["t0", "t1", "t2"], "source": ["x"] * 3}))
    run.write_table("prepare/part-000001.parquet", pa.table({"doc_id": docs[3:], "text": ["t3", "t4", "t5"], "source": ["x"] * 3}))
    emb = np.arange(12, dtype=np.float32).reshape(6, 2)
    run.write_table("encode/emb-part-000000-000000000.parquet", embeddings_table(docs[3:][::-1], emb[3:][::-1]))
    run.write_table("encode/emb-part-000001-000000000.parquet", embeddings_table(docs[:3], emb[:3]))
    run.write_table("cluster/assignments.parquet", pa.table({"doc_id": docs, "cluster": pa.array([0, 1, 0, 1, 1, 0], pa.int32())}))
    run.write_table("cluster/neighbors.parquet", pa.table({"cluster": pa.array([1, 0], pa.int32()), "size": [3, 3],
                                                          "neighbors": [[0], [1]]}))
    run.write_table("questions/questions.parquet", pa.table({"question_id": pa.array([1, 0], pa.int32()), "text": ["b?", "a?"]}))
    run.write_table("labels/labels.parquet", pa.table({"doc_id": ["d0"], "question_id": [0], "answer": [True]}))
    run.makedirs("model")
    for stage in ("prepare", "encode", "cluster", "questions", "labels", "model"):
        finish(run, stage)
    return run


def test_readers(run):
    assert [p.rsplit("/", 1)[1] for p in corpus_shards(run)] == ["part-000000.parquet", "part-000001.parquet"]
    assert load_corpus(run, ["text"]).column("text").to_pylist() == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert load_texts(run, np.array(["d4", "d1", "d4", "zz"], dtype=object)) == {"d1": "t1", "d4": "t4"}
    assert load_texts(run, []) == {}
    ids, emb = load_embeddings(run)
    assert ids.tolist() == [f"d{i}" for i in range(6)] and emb.dtype == np.float32
    assert emb.tolist() == np.arange(12, dtype=np.float32).reshape(6, 2).tolist()
    sub_ids, sub = load_embeddings(run, ["d5", "d1"])
    assert sub_ids.tolist() == ["d1", "d5"] and sub.tolist() == [[2.0, 3.0], [10.0, 11.0]]
    with pytest.raises(ArtifactError, match="embeddings missing for 1 of 2 requested documents; redo it: `cqg-ray run --force encode`"):
        load_embeddings(run, ["d1", "nope"])
    assert load_doc_ids(run).tolist() == [f"d{i}" for i in range(6)]
    cl = Clusters.load(run)
    assert cl.k == 2 and cl.labels.tolist() == [0, 1, 0, 1, 1, 0] and cl.neighbors.tolist() == [[1], [0]]
    assert cl.index().members(1).tolist() == [1, 3, 4]
    assert load_questions(run).column("text").to_pylist() == ["a?", "b?"]
    assert load_labels(run).num_rows == 1
    assert model_path(run) == run.uri("model")


def test_readers_name_the_missing_stage(run):
    run.invalidate("cluster")
    with pytest.raises(ArtifactError, match="stage 'cluster' has not finished .* run `cqg-ray cluster"):
        Clusters.load(run)
    run.invalidate("questions")
    with pytest.raises(ArtifactError, match="cqg-ray cqg"):
        load_questions(run)


def test_another_table_in_a_stages_place_is_named(run):
    run.write_table("questions/questions.parquet", pa.table({"doc_id": ["x", "y"]}))  # same rows, other columns
    with pytest.raises(ArtifactError, match=r"questions.parquet lacks the column\(s\) question_id, text \(it has doc_id\)"):
        load_questions(run)


def test_question_embeddings_are_read_for_their_encoder_only(run):
    """The questions stage's embeddings, by question_id; None for a run without them or made by another encoder or
    backend (the caller embeds the questions itself)."""
    emb = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert load_question_embeddings(run, "enc", "torch", 2) is None  # a run of an earlier version
    t = question_embeddings_table(emb, "enc", "torch")
    assert t.column("question_id").to_pylist() == [0, 1] and t.schema.field("embedding").type == pa.list_(pa.float32(), 3)
    run.write_table("questions/embeddings.parquet", t.take([1, 0]))  # read back in question_id order
    back = load_question_embeddings(run, "enc", "torch", 2)
    assert back.dtype == np.float32 and back.tolist() == emb.tolist()
    assert load_question_embeddings(run, "other", "torch", 2) is None
    assert load_question_embeddings(run, "enc", "onnx", 2) is None
    with pytest.raises(ArtifactError, match=r"holds question ids 0..1 \(2 rows\) where questions.parquet has 0..2; redo it: `cqg-ray run --force questions`"):
        load_question_embeddings(run, "enc", "torch", 3)


def test_cluster_outside_the_neighbour_table_is_an_error(run):
    run.write_table("cluster/assignments.parquet", pa.table({"doc_id": ["d0"], "cluster": pa.array([2], pa.int32())}))
    with pytest.raises(ArtifactError, match="neighbors.parquet lacks"):
        Clusters.load(run)


def test_texts_by_id_reads_file_by_file(tmp_path):
    run = RunDir(str(tmp_path))
    run.write_table("a.parquet", pa.table({"doc_id": ["x", "y"], "text": ["X", "Y"]}))
    run.write_table("b.parquet", pa.table({"doc_id": ["z"], "text": ["Z"], "other": [1]}))
    files = [run.path("a.parquet"), run.path("b.parquet")]
    assert texts_by_id(files, ["z", "x"], run.fs) == {"x": "X", "z": "Z"}
    assert texts_by_id(files, np.array([], dtype=object), run.fs) == {}


def test_embed_output_readers(tmp_path):
    out = str(tmp_path / "emb")
    run = RunDir(out)
    with pytest.raises(ArtifactError, match="no such folder; give the OUT folder"):
        embed_output_files(out)
    run.makedirs()
    with pytest.raises(ArtifactError, match="not a cqg-ray embed output"):
        embed_output_files(out)
    run.write_json("_settings.json", {})
    with pytest.raises(ArtifactError, match="unfinished .* run `cqg-ray embed MODEL CORPUS"):
        read_embed_output(out)
    run.write_table("emb-part-000000-000000000.parquet", embeddings_table(["b", "a"], np.array([[1], [2]], np.uint8)))
    run.write_table("emb-part-000001-000000000.parquet", embeddings_table(["c"], np.array([[3]], np.uint8)))
    run.write_table(f"{EMBED_CORPUS}/part-000000.parquet", pa.table({"doc_id": ["b", "a"], "text": ["B", "A"]}))
    run.write_bytes("_manifest.json", json.dumps({"m": 5, "output": "bits", "tau": 0.5}).encode())
    ids, packed, meta = read_embed_output(out)
    assert ids.tolist() == ["b", "a", "c"] and packed.tolist() == [[1], [2], [3]] and meta["m"] == 5
    assert embed_output_texts(out, ["a", "c"]) == {"a": "A"}
    for f in list(run.ls(suffix=".parquet")):
        run.rm(f)
    ids, packed, _ = read_embed_output(out)
    assert ids.tolist() == [] and packed.shape == (0, 1) and packed.dtype == np.uint8


def test_file_on_path_names_the_file_that_stands_where_a_folder_would_go(tmp_path, monkeypatch):
    """The one walk that evaluate's --out check and export's OUT check share: the path itself or the nearest existing
    folder above it, when that is a file, named as the path names it."""
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "d").mkdir()
    assert file_on_path(str(tmp_path / "notes.txt")) == str(tmp_path / "notes.txt")
    assert file_on_path(str(tmp_path / "notes.txt" / "a" / "b")) == str(tmp_path / "notes.txt")
    assert file_on_path(str(tmp_path / "d")) is None
    assert file_on_path(str(tmp_path / "d" / "new" / "deeper")) is None
    monkeypatch.chdir(tmp_path)
    assert file_on_path("notes.txt/a/") == "notes.txt"
    assert file_on_path("./d/../notes.txt/a") == "notes.txt"
    assert file_on_path("new/folder") is None


def test_a_unit_file_changed_in_a_page_is_refused_with_how_to_write_it_again(tmp_path):
    """A byte flipped inside an embed unit's page (its size unchanged) was read as other values without a word, or as
    pyarrow's 'Wrapping ... failed' traceback in doc_id; embed writes page checksums, which the readers now check."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cqg_ray.artifacts import read_unit
    from cqg_ray.rundir import ArtifactError, RunDir

    path = tmp_path / "emb-part-000000-000000000.parquet"
    table = pa.table({"doc_id": [f"d{i}" for i in range(500)], "embedding": pa.array(list(np.random.default_rng(0).random((500, 4))))})
    pq.write_table(table, path, write_page_checksum=True)
    run = RunDir(str(tmp_path))
    assert read_unit(run, str(path)).equals(table)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a data page: the footer and the magic bytes are at the ends
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as e:
        read_unit(run, str(path))
    said = str(e.value)
    assert said.startswith(f"{tmp_path}/emb-part-000000-000000000.parquet is damaged (") and "CRC" in said
    assert said.endswith("delete that file and the folder's _manifest.json, then run the same `cqg-ray embed ...` command: it "
                         "writes the missing units again and keeps the others (--force redoes them all)")
