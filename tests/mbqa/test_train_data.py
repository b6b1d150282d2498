"""The training data's pure core (no Ray): text rows, a worker's shard arrays, the CPUs kept for Ray Data, the stats."""

import numpy as np
import pyarrow as pa
import pytest
import torch

from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.loop import steps_per_epoch
from cqg_ray.mbqa.pairs import LabelPairs
from cqg_ray.mbqa.report import evaluate_heads
from cqg_ray.mbqa.train_data import confusion_report, file_texts, label_lookup, shard_arrays, text_stats, texts_table, worker_cpus


def small_table():
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    # text 0: questions 2, 0; text 1: none (dropped); text 2: question 1
    return texts_table(np.array(["b", "c", "a"]), emb, np.array([0, 2, 0]), np.array([2, 1, 0]), np.array([1, 0, 0]),
                       np.array([0.9, 0.2, 0.1]), np.array([0, 0, 2]))


def test_texts_table_has_one_row_per_labelled_text():
    t = small_table()
    assert t.column_names == ["doc_id", "embedding", "question", "answer", "target", "part"]
    assert t.column("doc_id").to_pylist() == ["b", "a"]
    assert t.column("question").to_pylist() == [[2, 0], [1]]
    assert t.column("answer").to_pylist() == [[1, 0], [0]]
    assert t.column("part").to_pylist() == [0, 2]
    assert t.schema.field("part").type == pa.int8()
    boolean = texts_table(np.array(["b", "a"]), np.zeros((2, 1), np.float32), np.array([0, 1]), np.array([0, 0]), np.array([1, 0]),
                          part=np.array([False, True]))
    assert boolean.column("part").to_pylist() == [0, 1]  # held out by a bool mask: the select part
    assert t.column("embedding").to_pylist()[1] == [8.0, 9.0, 10.0, 11.0]


def test_shard_arrays_are_canonical_whatever_the_row_order():
    t = small_table()
    shard = shard_arrays([t], 4)
    assert shard["emb"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]  # in arrival order: b, a
    assert shard["row"].tolist() == [1, 0, 0]  # pairs by doc_id: a's question 1, then b's 0 and 2
    assert shard["question"].tolist() == [1, 0, 2]
    assert shard["label"].tolist() == [0, 0, 1]
    assert shard["answer"].dtype == np.float32 and shard["answer"].tolist() == pytest.approx([0.2, 0.1, 0.9])
    assert shard["texts"] == 2
    backwards = shard_arrays([t.slice(1), pa.table({}), t.slice(0, 1)], 4)  # other blocks, other order, an empty one
    assert backwards["row"].tolist() == [0, 1, 1]
    for k in ("question", "answer", "label"):
        assert np.array_equal(backwards[k], shard[k]), k
    assert np.array_equal(backwards["emb"][backwards["row"]], shard["emb"][shard["row"]])  # each pair sees the same text
    empty = shard_arrays([], 4)
    assert empty["emb"].shape == (0, 4) and len(empty["row"]) == 0 and empty["texts"] == 0


def test_shard_arrays_copy_each_batch_once_and_keep_none():
    """The embeddings buffer owns its memory (no view into a batch), holds each row once, and the batches are gone."""
    import gc
    import weakref

    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    batches = [texts_table(np.array([f"d{i}" for i in range(j, j + 5)]), emb[j:j + 5], np.arange(5), np.zeros(5, int), np.ones(5, int))
               for j in (0, 5)]
    alive = [weakref.ref(b.column("embedding").chunk(0).buffers()[-1]) for b in batches]
    shard = shard_arrays(iter(batches), 4)
    del batches
    gc.collect()
    assert [r() for r in alive] == [None, None]
    assert shard["emb"].flags.owndata and shard["emb"].tolist() == emb.tolist()
    assert shard["row"].tolist() == list(range(10))


def test_a_text_split_over_two_rows_is_one_text():
    emb = np.ones((1, 2), np.float32)
    a = texts_table(np.array(["x"]), emb, np.array([0]), np.array([3]), np.array([1]))
    b = texts_table(np.array(["x"]), emb, np.array([0]), np.array([1]), np.array([0]))
    shard = shard_arrays([a, b], 2)
    assert shard["texts"] == 1 and shard["row"].tolist() == [0, 0] and shard["question"].tolist() == [1, 3]


def test_unequal_shards_give_unequal_step_counts():
    """What the train loop's all-reduce max is for: two shards of one split need different numbers of steps."""
    emb = np.zeros((3, 2), np.float32)
    big = shard_arrays([texts_table(np.array(["a", "b", "c"]), emb, np.array([0, 1, 2]), np.array([0, 0, 0]), np.array([1, 0, 1]))], 2)
    small = shard_arrays([texts_table(np.array(["d"]), emb[:1], np.array([0]), np.array([0]), np.array([1]))], 2)
    assert steps_per_epoch([big], 1, 1) == 3 and steps_per_epoch([small], 1, 1) == 1
    assert steps_per_epoch([big, small], 1, 1) == 3


def test_worker_cpus_keep_cpus_for_ray_data():
    assert worker_cpus(1.0, 2, cluster_cpus=2, data_cpus=0.5) == 0.75  # 2 x 1 CPU would leave Data nothing
    assert worker_cpus(1.0, 2, cluster_cpus=8, data_cpus=0.5) == 1.0  # room for both: as asked
    assert worker_cpus(0.5, 2, cluster_cpus=2, data_cpus=0.5) == 0.5
    with pytest.raises(ValueError, match="no more than the 2 kept for Ray Data"):
        worker_cpus(1.0, 1, cluster_cpus=2, data_cpus=2)


def test_text_stats_and_the_report_from_counts_match_the_arrays(problem):
    emb, dense = problem(n_docs=60, d=8, m=3, per_question=30)
    pairs = LabelPairs.from_dense(dense)
    docs = np.unique(pairs.doc)
    part = np.where(docs % 3 == 0, 1, 0) + np.where(docs % 6 == 0, 1, 0)  # held out: multiples of 3; of those, 6's report
    held = part > 0
    table = texts_table(docs.astype(str), emb[docs], np.searchsorted(docs, pairs.doc), pairs.question, pairs.answer, None, part)
    torch.manual_seed(0)
    heads = StackedHeads(8, 3)
    s = text_stats(table, heads, 0.5)
    assert s["labels"].tolist() == np.bincount(pairs.question, minlength=3).tolist()
    assert s["yes"].tolist() == np.bincount(pairs.question, weights=pairs.answer, minlength=3).astype(int).tolist()
    assert s["prob_sum"] / s["texts"] == pytest.approx(heads.mean_probabilities(emb[docs]), abs=1e-6)
    is_held = np.isin(pairs.doc, docs[held])
    assert (s["held_pairs"], s["train_pairs"], s["train_texts"]) == (int(is_held.sum()), int((~is_held).sum()), int((~held).sum()))
    assert confusion_report(s["confusion"], 0.5) == evaluate_heads(heads, emb, pairs.select(is_held), 0.5)
    trained = pairs.select(~is_held)
    assert s["train_labels"].tolist() == np.bincount(trained.question, minlength=3).tolist()
    assert s["train_yes"].tolist() == np.bincount(trained.question, weights=trained.answer, minlength=3).astype(int).tolist()
    # the held-out pairs themselves, text by text in the table's order, each with its head's logit and its part
    held_pairs = pairs.select(is_held)
    order = np.lexsort((np.arange(len(held_pairs)), held_pairs.doc))  # the table's rows are the sorted docs
    assert s["held_question"].tolist() == held_pairs.question[order].tolist()
    assert s["held_answer"].tolist() == held_pairs.answer[order].tolist()
    assert s["held_part"].tolist() == [1 + int(d % 6 == 0) for d in held_pairs.doc[order]]
    with torch.no_grad():
        z = heads.forward_pairs(torch.tensor(emb[held_pairs.doc[order]]), torch.tensor(held_pairs.question[order].astype(np.int64)))
    assert s["held_logit"] == pytest.approx(z.numpy(), abs=1e-6)
    means = text_stats(table, heads.subset(np.array([True, False, True])), 0.5, means_only=True)  # heads no longer matching the ids
    assert set(means) == {"prob_sum", "texts"} and means["texts"] == len(docs)
    # two heads' product against three heads': float32 rows may round differently (one unit in the last place on oneDNN's
    # AVX2 kernels on an Intel Xeon), so float32's rounding of one probability a text bounds the float64 sums' difference
    assert means["prob_sum"] == pytest.approx(s["prob_sum"][[0, 2]], abs=len(docs) * 2 * float(np.finfo(np.float32).eps))


def test_a_file_task_gives_the_rows_of_its_labelled_texts(tmp_path):
    """`file_texts` reads its embedding files in batches and joins their labels: the same rows as `label_lookup` on the
    files' rows at once; a file with no rows gives none."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from cqg_ray.artifacts import embeddings_table

    rng = np.random.default_rng(0)
    ids = np.array([f"d{i:03d}" for i in range(30)], dtype=object)
    emb = rng.normal(size=(30, 4)).astype(np.float32)
    for i, part in enumerate((slice(0, 17), slice(17, 30), slice(0, 0))):
        pq.write_table(embeddings_table(ids[part], emb[part]), tmp_path / f"emb-{i}.parquet")
    labelled = ids[::3]  # every third text, two questions each
    pq.write_table(pa.table({"doc_id": np.repeat(labelled, 2).astype(str), "question_id": np.tile(np.int32([0, 1]), len(labelled)),
                             "answer": np.arange(2 * len(labelled)) % 2 == 0, "p_yes": np.linspace(0, 1, 2 * len(labelled), dtype=np.float32),
                             "source": ["cluster"] * (2 * len(labelled))}), tmp_path / "labels.parquet")
    fs, held = pafs.LocalFileSystem(), pa.array(["d003", "d027"])
    paths = [str(tmp_path / f"emb-{i}.parquet") for i in range(3)]
    got = file_texts(pa.table({"path": paths}), str(tmp_path / "labels.parquet"), fs, held, True, rows=4, report_ids=pa.array(["d027"]))
    whole = label_lookup(embeddings_table(ids, emb), str(tmp_path / "labels.parquet"), fs, held, True, pa.array(["d027"]))
    assert got.to_pylist() == whole.to_pylist() and got.num_rows == 10
    assert {r["doc_id"]: r["part"] for r in got.to_pylist() if r["part"]} == {"d003": 1, "d027": 2}
    empty = file_texts(pa.table({"path": paths[2:]}), str(tmp_path / "labels.parquet"), fs, held, True, rows=4)
    assert empty.num_rows == 0 and empty.schema == got.schema
    # labels in no order, in row groups of 3: the lookup's id range prunes row groups by their statistics, never a label
    shuffled = pq.read_table(tmp_path / "labels.parquet").take(rng.permutation(2 * len(labelled)))
    pq.write_table(shuffled, tmp_path / "labels-shuffled.parquet", row_group_size=3)
    again = file_texts(pa.table({"path": paths}), str(tmp_path / "labels-shuffled.parquet"), fs, held, True, rows=4, report_ids=pa.array(["d027"]))

    def rows(t):  # a text's pairs in question order (they follow the labels file's order)
        return sorted((r["doc_id"], r["embedding"], r["part"], sorted(zip(r["question"], r["answer"], r["target"]))) for r in t.to_pylist())

    assert rows(again) == rows(got) and again.num_rows == 10


def test_a_data_worker_fetches_the_heads_once(ray_local):
    import ray

    from cqg_ray.mbqa.heads import StackedHeads
    from cqg_ray.mbqa.train_data import worker_heads

    a, b = ray.put(StackedHeads(4, 3, 2)), ray.put(StackedHeads(4, 5, 2))
    first = worker_heads(a)
    assert worker_heads(a) is first and first.m == 3
    assert worker_heads(b).m == 5 and worker_heads(a) is not first  # a new model replaces the kept one
