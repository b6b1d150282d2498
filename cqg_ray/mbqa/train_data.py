"""The training data as Ray Data: one row per labelled text, built by Data workers, gathered per Train worker.

A row is one labelled text: ``doc_id``, ``embedding`` (its frozen encoder embedding), ``question`` (list<int32>),
``answer`` (list<int8>, the LLM's 0/1), ``target`` (list<float32>, what the heads are fitted to: the answer, or
P(yes) with soft labels) and ``part`` (0: trained on; held out: 1 select, 2 report, `mbqa.reliability`). `run_texts` builds the rows from a run
directory: Data workers read encode/ and look up each batch's labels in labels/labels.parquet, so every text is
one row and neither the labels nor the embeddings pass through the driver. `arrays_dataset` builds the same rows
from arrays (the array API of `train_heads`, tests, benches). Each Ray Train worker turns its shard, batch by batch,
into the arrays `loop.run_epochs` trains on (`shard_arrays`); `dataset_stats` is the pass after training (per-question
label counts, the heads' mean probabilities, the held-out pairs with the heads' logits).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cqg_ray.artifacts import embedding_batches, embedding_matrix

TEXT_COLUMNS = ("doc_id", "embedding", "question", "answer", "target", "part")
BLOCKS = 16  # blocks of `arrays_dataset`: several per Train worker, so each gets a share of the texts


def texts_table(doc_id, embedding: np.ndarray, pair_text: np.ndarray, question: np.ndarray, answer: np.ndarray,
                target: np.ndarray | None = None, part: np.ndarray | None = None) -> pa.Table:
    """One row per text that has pairs: text i's pairs are those with ``pair_text == i`` (in their order).

    ``doc_id`` and ``embedding`` (n, d) are per text; ``part`` (n,) int8 per text (default: 0, none held out; a bool
    array reads as held out = 1, the select part).
    """
    doc_id = np.asarray(doc_id)
    embedding = np.asarray(embedding, dtype=np.float32)
    pair_text = np.asarray(pair_text, dtype=np.int64)
    target = np.asarray(answer, dtype=np.float32) if target is None else np.asarray(target, dtype=np.float32)
    part = np.zeros(len(doc_id), dtype=np.int8) if part is None else np.asarray(part).astype(np.int8)
    order = np.argsort(pair_text, kind="stable")
    counts = np.bincount(pair_text, minlength=len(doc_id))
    has = counts > 0
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts[has])]).astype(np.int32))
    d = embedding.shape[1]

    def lists(values, type_):
        return pa.ListArray.from_arrays(offsets, pa.array(np.asarray(values)[order], type_))

    return pa.table({
        "doc_id": pa.array(doc_id[has].astype(str), pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embedding[has].ravel(), pa.float32()), d),
        "question": lists(question, pa.int32()),
        "answer": lists(answer, pa.int8()),
        "target": lists(target, pa.float32()),
        "part": pa.array(part[has], pa.int8()),
    })


def shard_arrays(tables: Iterable[pa.Table], d: int) -> dict:
    """A Train worker's shard (batches of text rows, as they arrive) -> the arrays `run_epochs` trains on.

    The embeddings are copied once, batch by batch, into one buffer that grows in place (``ndarray.resize``: a
    realloc, so no second copy of the shard), and no batch is kept. The pairs come out in a canonical order, texts
    by doc_id (a text in two rows is one text), then question, so what is trained (``question``, ``answer``,
    ``emb[row]``) depends on which texts the shard holds, not on the order its blocks arrived in; ``emb`` itself is
    in arrival order. Returns ``emb`` (rows, d) float32, ``row`` (the emb row of each pair's text), ``question``,
    ``answer`` (the training target, float32), ``label`` (the 0/1 answers, int8) and ``texts`` (distinct texts).
    """
    emb = np.zeros((0, d), np.float32)
    ids, text, question, answer, label = [], [], [], [], []
    for table in tables:
        n, start = table.num_rows, len(emb)
        if n == 0:
            continue
        ids.append(table.column("doc_id").to_numpy(zero_copy_only=False).astype(str))
        emb.resize((start + n, d), refcheck=False)
        emb[start:] = embedding_matrix(table.column("embedding"))
        q_col = pa.chunked_array(table.column("question")).combine_chunks()
        text.append(pc.list_parent_indices(q_col).to_numpy().astype(np.int64) + start)
        question.append(pc.list_flatten(q_col).to_numpy().astype(np.int32))
        answer.append(pc.list_flatten(table.column("target")).to_numpy().astype(np.float32))
        label.append(pc.list_flatten(table.column("answer")).to_numpy().astype(np.int8))
    if not ids:
        return {"emb": emb, "row": np.zeros(0, np.int64), "question": np.zeros(0, np.int32),
                "answer": np.zeros(0, np.float32), "label": np.zeros(0, np.int8), "texts": 0}
    names, first, rank = np.unique(np.concatenate(ids), return_index=True, return_inverse=True)
    text_rank = rank[np.concatenate(text)]
    question, answer, label = np.concatenate(question), np.concatenate(answer), np.concatenate(label)
    order = np.lexsort((question, text_rank))
    return {"emb": emb, "row": first[text_rank][order].astype(np.int64), "question": question[order],
            "answer": answer[order], "label": label[order], "texts": len(names)}


def worker_cpus(cpus_per_worker: float, num_workers: int, cluster_cpus: float, data_cpus: float) -> float:
    """CPUs each Train worker asks for: ``cpus_per_worker``, cut so that ``data_cpus`` of the cluster stay free for
    the Ray Data tasks that feed the workers (workers holding every CPU leave Data none, and training waits forever)."""
    free = cluster_cpus - data_cpus
    if free <= 0:
        raise ValueError(f"train: the cluster has {cluster_cpus:g} CPUs, no more than the {data_cpus:g} kept for Ray Data (train.data_cpus)")
    return min(float(cpus_per_worker), free / num_workers)


def text_stats(table: pa.Table, heads, tau: float, means_only: bool = False) -> dict:
    """One batch of text rows -> per-question label and yes counts (all, and trained-on), the sum of each head's P(yes)
    over the texts, the held-out confusion counts [[tn, fp], [fn, tp]] at tau, the numbers of texts and pairs, and the
    held-out pairs themselves (``held_question``, ``held_answer``, ``held_logit``: the head's logit, ``held_part``).
    ``means_only``: the P(yes) sums and the number of texts alone (heads that no longer match the rows' question ids)."""
    from cqg_ray.mbqa.reliability import sigmoid
    from cqg_ray.mbqa.report import predict_pairs

    m = heads.m
    question = pc.list_flatten(table.column("question")).to_numpy().astype(np.int64)
    answer = pc.list_flatten(table.column("answer")).to_numpy().astype(np.int64)
    emb = embedding_matrix(table.column("embedding")).astype(np.float32, copy=False)
    prob_sum = heads.probability_sums(emb) if len(emb) else np.zeros(m)
    if means_only:
        return {"prob_sum": prob_sum, "texts": table.num_rows}
    q_col = pa.chunked_array(table.column("question")).combine_chunks()
    text = pc.list_parent_indices(q_col).to_numpy()
    text_part = table.column("part").to_numpy(zero_copy_only=False).astype(np.int8)
    part = text_part[text]
    is_held = part > 0
    logit = predict_pairs(heads, emb, text[is_held], question[is_held], logits=True)
    confusion = np.bincount(answer[is_held] * 2 + (sigmoid(logit) > tau).astype(np.int64), minlength=4)
    trained = ~is_held
    return {"labels": np.bincount(question, minlength=m), "yes": np.bincount(question, weights=answer, minlength=m).astype(np.int64),
            "train_labels": np.bincount(question[trained], minlength=m),
            "train_yes": np.bincount(question[trained], weights=answer[trained], minlength=m).astype(np.int64),
            "prob_sum": prob_sum, "confusion": confusion, "texts": table.num_rows,
            "train_pairs": int(trained.sum()), "held_pairs": int(is_held.sum()), "train_texts": int((text_part == 0).sum()),
            "held_question": question[is_held].astype(np.int32), "held_answer": answer[is_held].astype(np.int8),
            "held_logit": logit, "held_part": part[is_held]}


HELD_PAIRS = ("held_question", "held_answer", "held_logit", "held_part")  # concatenated across batches, not summed


def add_stats(a: dict, b: dict) -> dict:
    return {k: np.concatenate([a[k], b[k]]) if k in HELD_PAIRS else a[k] + b[k] for k in a}


def confusion_report(confusion: np.ndarray, tau: float) -> dict:
    """The Table 6 report (`report.classification_report`) from the counts [tn, fp, fn, tp]."""
    from cqg_ray.mbqa.report import classification_report

    tn, fp, fn, tp = (int(c) for c in confusion)
    y_true = np.repeat([0, 0, 1, 1], [tn, fp, fn, tp])
    y_pred = np.repeat([0, 1, 0, 1], [tn, fp, fn, tp])
    report = classification_report(y_true, y_pred)
    report["tau"] = tau
    return report


# ------------------------------------------------------------------------------------------ the Ray layer

DATA_TASK_CPUS = 0.25  # what each Data task that reads or builds text rows asks for (fits in train.data_cpus)


def label_lookup(batch: pa.Table, labels_path: str, fs, held_ids: pa.Array, soft: bool, report_ids: pa.Array | None = None) -> pa.Table:
    """A Ray Data task: a batch of encode/ rows -> the text rows of those that are labelled (their labels read from
    labels.parquet with a doc_id filter, the ids and their range: the file's row-group statistics narrow the range when it is sorted).
    A text in ``held_ids`` is held out: part 2 (report) when it is in ``report_ids`` too, else 1 (select)."""
    import pyarrow.dataset as ds

    ids = batch.column("doc_id").combine_chunks()  # one typed array, also for a batch of no rows
    emb = embedding_matrix(batch.column("embedding"))
    wanted = ds.field("doc_id").isin(ids)
    if len(ids):  # the ids' range as well: row-group statistics prune a range, not a long isin
        lo, hi = pc.min_max(ids).values()
        wanted = (ds.field("doc_id") >= lo) & (ds.field("doc_id") <= hi) & wanted
    labels = ds.dataset(labels_path, filesystem=fs, format="parquet").to_table(
        columns=["doc_id", "question_id", "answer", "p_yes"], filter=wanted)
    if soft and labels.column("p_yes").null_count:
        raise RuntimeError(f"train.soft_labels needs P(yes) for every label; {labels.column('p_yes').null_count} have none")
    doc_ids = ids.to_numpy(zero_copy_only=False)
    by_id = np.argsort(doc_ids)
    pair_text = by_id[np.searchsorted(doc_ids[by_id], labels.column("doc_id").to_numpy(zero_copy_only=False))]
    return texts_table(doc_ids, emb, pair_text, labels.column("question_id").to_numpy().astype(np.int32),
                       labels.column("answer").to_numpy(zero_copy_only=False).astype(np.int8),
                       labels.column("p_yes").to_numpy(zero_copy_only=False) if soft else None,
                       _part(ids, held_ids, report_ids))


def _part(ids: pa.Array, held_ids: pa.Array, report_ids: pa.Array | None) -> np.ndarray:
    part = pc.is_in(ids, value_set=held_ids).to_numpy(zero_copy_only=False).astype(np.int8)
    if report_ids is not None:
        part += pc.is_in(ids, value_set=report_ids).to_numpy(zero_copy_only=False).astype(np.int8)
    return part


def file_texts(batch: pa.Table, labels_path: str, fs, held_ids: pa.Array, soft: bool, rows: int, report_ids: pa.Array | None = None) -> pa.Table:
    """A Ray Data task over embedding files (a ``path`` column): each file read here in batches of ``rows`` rows, each
    batch's labels looked up (`label_lookup`); the text rows of the labelled texts. Only these rows leave the task:
    the embeddings of the unlabelled texts never enter the object store."""
    return pa.concat_tables([label_lookup(t, labels_path, fs, held_ids, soft, report_ids)
                             for t in embedding_batches(batch.column("path").to_pylist(), fs, rows)])


def run_texts(embedding_files: list[str], labels_path: str, fs, held_ids, soft: bool, batch_size: int = 4096, report_ids=None):
    """The run's labelled texts as a Ray Dataset (`TEXT_COLUMNS`): one task a file of encode/ (`file_texts`: it reads
    the file and joins its labels per batch). Block order follows the files, so a Train split of it is the same on
    every run. ``held_ids``: the held-out texts; ``report_ids``: those of them in the report part."""
    import ray.data

    ids = lambda v: None if v is None else pa.array(list(map(str, v)), pa.string())  # noqa: E731
    paths = ray.data.from_items([{"path": p} for p in embedding_files], override_num_blocks=max(1, len(embedding_files)))
    return paths.map_batches(file_texts, fn_kwargs={"labels_path": labels_path, "fs": fs, "held_ids": ids(held_ids), "report_ids": ids(report_ids),
                                                    "soft": soft, "rows": batch_size},
                             batch_format="pyarrow", batch_size=1, num_cpus=DATA_TASK_CPUS)


def training_rows(texts):
    """The rows that are not held out."""
    return texts.map_batches(lambda t: t.filter(pc.equal(t.column("part"), 0)), batch_format="pyarrow", batch_size=None,
                             num_cpus=DATA_TASK_CPUS)


def arrays_dataset(embeddings: np.ndarray, pairs, held: np.ndarray | None = None, blocks: int = BLOCKS):
    """The texts of `LabelPairs` over embedding rows as a Ray Dataset of `blocks` blocks (``doc_id`` = the row number)."""
    import ray.data

    docs = np.unique(pairs.doc)
    table = texts_table(docs, np.asarray(embeddings)[docs], np.searchsorted(docs, pairs.doc), pairs.question, pairs.answer,
                        pairs.target, None if held is None else np.isin(docs, held))
    table = table.set_column(0, "doc_id", pa.array([f"{int(i):012d}" for i in docs], pa.string()))
    rows = max(1, -(-table.num_rows // blocks))
    return ray.data.from_arrow([table.slice(i, rows) for i in range(0, max(table.num_rows, 1), rows)])


_HEADS: dict = {}  # a Data worker's copy of the heads of `dataset_stats` (the last ones fetched), by object id


def worker_heads(ref):
    """The heads behind ``ref``, fetched once per worker process (fetching them for every batch grew a worker by
    ~40 MB a task at m = 2,000: 1.5 GB after 30 files)."""
    import ray

    key = ref.hex()
    if key not in _HEADS:
        _HEADS.clear()
        _HEADS[key] = ray.get(ref)
    return _HEADS[key]


def dataset_stats(texts, heads, tau: float, means_only: bool = False) -> dict:
    """`text_stats` summed over a dataset of text rows (one pass of Data workers; the driver sums the counters). A task
    takes one block (an encode file's labelled texts): with a batch size Ray Data bundled many files into one task,
    whose worker reached 0.93 GB over 80 files of the 1M rehearsal (0.70 GB this way)."""
    import ray

    heads_ref = ray.put(heads)

    def stats(batch: pa.Table) -> dict:
        s = text_stats(batch, worker_heads(heads_ref), tau, means_only)
        return {k: [np.atleast_1d(np.asarray(v, dtype=np.float64))] for k, v in s.items()}

    total = None
    for batch in texts.map_batches(stats, batch_format="pyarrow", batch_size=None, num_cpus=DATA_TASK_CPUS).iter_rows():
        total = dict(batch) if total is None else add_stats(total, batch)
    if total is None:
        raise RuntimeError("train: no labelled texts")
    vectors = ("labels", "yes", "train_labels", "train_yes", "prob_sum", "confusion")
    kinds = {"held_question": np.int32, "held_answer": np.int8, "held_logit": np.float32, "held_part": np.int8}
    return {k: np.asarray(v, dtype=kinds[k]) if k in kinds else
            (v if k == "prob_sum" else np.rint(v).astype(np.int64)) if k in vectors else int(round(float(v[0])))
            for k, v in total.items()}
