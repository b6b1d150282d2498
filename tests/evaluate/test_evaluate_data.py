"""Loaders on the real shared data (small slices) and on small files written here for the error cases."""

import gzip
import json

import numpy as np
import pytest

from cqg_ray.evaluate.data import (
    DataError,
    dataset_name,
    default_datasets,
    load_beir,
    load_clustering,
    load_sts,
)
from cqg_ray.textfiles import load_texts, sample_indices


def test_dataset_names():
    assert dataset_name("/x/sts/STSBenchmark.test.tsv") == "STS-B"
    assert dataset_name("/x/sts/STS12.test.tsv") == "STS12"
    assert dataset_name("/x/sts/STSBenchmark.dev.tsv") == "STSBenchmark.dev"
    assert dataset_name("/x/retrieval/scifact/") == "SciFact"
    assert dataset_name("/x/clustering/twentynewsgroups.jsonl.gz") == "TNG"
    assert dataset_name("/x/my_pairs.tsv") == "my_pairs"


def test_sample_indices_sorted_seeded_and_all():
    a = sample_indices(100, 10, seed=1)
    assert list(a) == sorted(a) and len(set(a)) == 10
    np.testing.assert_array_equal(a, sample_indices(100, 10, seed=1))
    np.testing.assert_array_equal(sample_indices(5, None, 0), np.arange(5))
    np.testing.assert_array_equal(sample_indices(5, 9, 0), np.arange(5))


# ----------------------------------------------------------------------------------------- STS


def test_load_sts_real_stsb(data_path):
    path = data_path("sts/STSBenchmark.test.tsv")
    full = load_sts(path)
    assert full.name == "STS-B" and len(full) == 1379
    assert full.sentence1[0] == "A girl is styling her hair."
    assert full.sentence2[0] == "A girl is brushing her hair."
    assert full.scores[0] == 2.5
    assert full.scores.min() >= 0 and full.scores.max() <= 5

    part = load_sts(path, max_pairs=200, seed=0)
    assert len(part) == 200
    pairs = set(zip(full.sentence1, full.sentence2, full.scores))
    assert all(p in pairs for p in zip(part.sentence1, part.sentence2, part.scores))
    again = load_sts(path, max_pairs=200, seed=0)
    assert again.sentence1 == part.sentence1

    texts, i1, i2 = part.unique_texts()
    assert len(texts) == len(set(texts))
    assert [texts[i] for i in i1] == part.sentence1 and [texts[i] for i in i2] == part.sentence2


def test_load_sts_quotes_are_text(data_path):
    sts12 = load_sts(data_path("sts/STS12.test.tsv"))
    assert len(sts12) == 3108
    assert any('"' in s for s in sts12.sentence1 + sts12.sentence2)


def test_load_sts_and_texts_written_with_quoting(tmp_path):
    p = tmp_path / "pairs.tsv"  # pandas' to_csv(sep="\t"): a field with a quote, tab or newline is quoted, its quotes doubled
    p.write_text('sentence1\tsentence2\tscore\n"He said ""hi""."\tHe greeted me.\t4.0\n"two\nlines"\tone line\t1.5\n')
    d = load_sts(str(p))
    assert d.sentence1 == ['He said "hi".', "two\nlines"] and d.sentence2 == ["He greeted me.", "one line"] and list(d.scores) == [4.0, 1.5]
    assert load_texts(str(p)).texts == ['He said "hi".', "He greeted me.", "two\nlines", "one line"]


def test_an_sts_csv_or_texts_in_another_format_are_named_as_such(tmp_path):
    """An STS CSV was read by tabs (its header one field: 'sentence1,sentence2,score'); a CSV or .txt of texts was read as
    JSON Lines ("broken JSON line")."""
    (tmp_path / "pairs.csv").write_text("sentence1,sentence2,score\na,b,1\n")
    with pytest.raises(DataError, match=r"pairs.csv: STS pairs are read from a TSV \(sentence1, sentence2 and score separated by "
                                        r"tabs\), not a CSV$"):
        load_sts(str(tmp_path / "pairs.csv"))
    for name in ("texts.csv", "texts.txt", "texts.txt.gz"):
        (tmp_path / name).write_text("text\na\n")
        with pytest.raises(DataError, match=rf"{name}: a file of texts here is JSONL \(a 'text' field a line, .jsonl or .json, "
                                            rf"optionally .gz\) or a TSV \(.tsv\); not .(csv|txt)$"):
            load_texts(str(tmp_path / name))


def test_load_sts_headerless_and_errors(tmp_path):
    p = tmp_path / "pairs.tsv"
    p.write_text("a cat\ta dog\t3.5\nthe sun\tthe moon\t1\n")
    d = load_sts(str(p))
    assert d.sentence1 == ["a cat", "the sun"] and list(d.scores) == [3.5, 1.0]

    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\tscore\nx\ty\tnot-a-number\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: score 'not-a-number'"):
        load_sts(str(bad))

    for i, score in enumerate(("nan", "NaN", "inf", "-Infinity")):  # the file's Spearman was n/a, or inf ranked first
        nan = tmp_path / f"nan{i}.tsv"
        nan.write_text(f"sentence1\tsentence2\tscore\na\tb\t1\nx\ty\t{score}\n")
        with pytest.raises(DataError) as e:
            load_sts(str(nan))
        assert str(e.value) == f"{nan}:3: score {score!r} is not a finite number"

    bom = tmp_path / "bom.tsv"  # a UTF-8 byte-order mark: the header's 'sentence1' was missing, a JSONL's first line broken
    bom.write_bytes(b"\xef\xbb\xbfsentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n")
    assert load_sts(str(bom)).sentence1 == ["a", "c"]
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes(b'\xef\xbb\xbf{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n')
    assert load_clustering(str(bom_jsonl)).texts == ["a", "b"]

    nocol = tmp_path / "nocol.tsv"
    nocol.write_text("left\tright\tgold\nx\ty\tz\n")
    with pytest.raises(DataError, match="must name sentence1, sentence2, score"):
        load_sts(str(nocol))

    with pytest.raises(DataError, match="file not found"):
        load_sts(str(tmp_path / "missing.tsv"))


# ----------------------------------------------------------------------------------------- BEIR


def test_load_beir_scifact_full(data_path):
    d = load_beir(data_path("retrieval/scifact"))
    assert d.name == "SciFact" and d.full_corpus
    assert len(d.docs) == 5183 and len(d.doc_ids) == len(set(d.doc_ids))
    assert len(d.query_ids) == 300
    assert sum(len(v) for v in d.qrels.values()) == 339
    assert all(q in d.qrels for q in d.query_ids)


def test_load_beir_scifact_subset_keeps_relevant_documents(data_path):
    d = load_beir(data_path("retrieval/scifact"), max_queries=50, max_docs=400, seed=0)
    assert len(d.query_ids) == 50 and not d.full_corpus
    assert len(d.docs) == 400
    ids = set(d.doc_ids)
    assert all(doc in ids for q in d.query_ids for doc, rel in d.qrels[q].items() if rel > 0)
    assert set(d.qrels) == set(d.query_ids)


def test_load_beir_layout_errors_and_title_join(tmp_path):
    with pytest.raises(DataError, match="qrels/test.tsv"):
        load_beir(str(tmp_path))
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td2\t1\n")
    with pytest.raises(DataError, match="queries"):
        load_beir(str(tmp_path))
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "what?"}\n{"_id": "q2", "text": "unjudged"}\n')
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "body"}\n{"_id": "d2", "text": "only"}\n')
    d = load_beir(str(tmp_path))
    assert d.query_ids == ["q1"] and d.docs == ["T body", "only"] and d.qrels == {"q1": {"d1": 1}}
    (tmp_path / "corpus.jsonl").write_text("\n")  # every query scored 0.00
    with pytest.raises(DataError) as e:
        load_beir(str(tmp_path))
    assert str(e.value) == f"{tmp_path}/corpus.jsonl: no documents"
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": ""}\n{"_id": "d2", "body": "x"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl: document 'd2' has neither a string text nor a string title \(keys: \['_id', 'body'\]\)"):
        load_beir(str(tmp_path))  # an empty text is kept (d1, as MTEB keeps it); a row with no text at all is not
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tinf\n")  # an OverflowError traceback
    with pytest.raises(DataError) as e:
        load_beir(str(tmp_path))
    assert str(e.value) == f"{tmp_path}/qrels/test.tsv:2: relevance 'inf' is not a finite number"
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": null}\n')
    with pytest.raises(DataError, match="every query needs an _id and a string text"):
        load_beir(str(tmp_path))


# ----------------------------------------------------------------------------------------- clustering


def test_load_clustering_20ng_text_and_subject(data_path):
    path = data_path("clustering/twentynewsgroups.jsonl.gz")
    d = load_clustering(path, max_docs=500, seed=0)
    assert d.name == "TNG" and len(d.texts) == 500 and len(d.labels) == 500
    assert d.n_labels == 20  # a random sample of 500 covers all 20 groups (first 500 lines would be one group)
    s = load_clustering(path, field="subject", max_docs=500, seed=0)
    assert s.name == "TNG-subject" and s.labels == d.labels
    assert max(len(t) for t in s.texts) < max(len(t) for t in d.texts)


def test_load_clustering_plain_and_gz_and_errors(tmp_path):
    rows = [{"text": f"t{i}", "label": i % 2} for i in range(6)]
    plain = tmp_path / "c.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_clustering(str(plain)), load_clustering(str(gz))
    assert a.texts == b.texts == [f"t{i}" for i in range(6)] and a.labels == ["0", "1"] * 3

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a", "label": 1}\n{"text": \n')
    with pytest.raises(DataError, match=r"broken.jsonl:2: broken JSON line"):
        load_clustering(str(broken))
    with pytest.raises(DataError, match="lacks 'subject'"):
        load_clustering(str(plain), field="subject")


def test_load_clustering_of_one_label_is_a_data_error(tmp_path):
    """One distinct label (or a --max-docs sample of one) was a ValueError traceback from k-means, after the encoding."""
    one = tmp_path / "one.jsonl"
    one.write_text("\n".join(json.dumps({"text": f"t{i}", "label": "x"}) for i in range(3)) + "\n")
    with pytest.raises(DataError) as e:
        load_clustering(str(one))
    assert str(e.value) == f"{one}: clustering needs at least two distinct 'label' values; found one"
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(4)) + "\n")
    with pytest.raises(DataError) as e:
        load_clustering(str(two), max_docs=1)
    assert str(e.value) == f"{two}: clustering needs at least two distinct 'label' values; found one in the 1 texts sampled (max_docs 1)"
    assert load_clustering(str(two)).n_labels == 2


def test_default_datasets_lists_existing_standard_sets(data_path):
    root = data_path("sts").rsplit("/", 1)[0]
    d = default_datasets(root)
    assert [p.rsplit("/", 1)[1] for p in d["sts"]] == ["STS12.test.tsv", "STS13.test.tsv", "STSBenchmark.test.tsv"]
    assert d["retrieval"][0].endswith("retrieval/scifact")
    assert d["clustering"][0].endswith("twentynewsgroups.jsonl.gz")
    assert d["faithfulness"] == [f"{root}/sts/STSBenchmark.test.tsv"]
    assert default_datasets("/nonexistent") == {"sts": [], "retrieval": [], "clustering": [], "faithfulness": []}


def test_load_texts_from_jsonl_tsv_and_sts(tmp_path, data_path):
    j = tmp_path / "t.jsonl.gz"
    with gzip.open(j, "wt", encoding="utf-8") as f:
        for t in ["one", "  two ", "", "one", "three"]:
            f.write(json.dumps({"text": t, "id": 1}) + "\n")
    d = load_texts(str(j))
    assert d.texts == ["one", "two", "three"] and d.name == "t" and len(d) == 3  # stripped, blanks and repeats dropped
    tsv = tmp_path / "t.tsv"
    tsv.write_text("id\ttext\n1\talpha\n2\tbeta\n")
    assert load_texts(str(tsv)).texts == ["alpha", "beta"]
    upper = tmp_path / "T.TSV.GZ"  # a suffix in capitals is read as the corpus reads it (detect_format)
    upper.write_bytes(gzip.compress(b"id\ttext\n1\tgamma\n"))
    assert load_texts(str(upper)).texts == ["gamma"]
    sts = load_texts(data_path("sts/STSBenchmark.test.tsv"))
    assert sts.name == "STS-B" and sts.texts[:2] == ["A girl is styling her hair.", "A girl is brushing her hair."]
    assert len(sts) == 2551


def test_load_texts_errors_name_the_problem(tmp_path):
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match="object 1 has no string field 'text'"):
        load_texts(str(bad))
    tsv = tmp_path / "b.tsv"
    tsv.write_text("a\tb\nx\ty\n")
    with pytest.raises(DataError, match="needs a header naming 'text'"):
        load_texts(str(tsv))
    short = tmp_path / "s.tsv"
    short.write_text("sentence1\tsentence2\nonly one\n")
    with pytest.raises(DataError, match="s.tsv:2: expected at least 2"):
        load_texts(str(short))
    empty = tmp_path / "e.jsonl"
    empty.write_text(json.dumps({"text": "  "}) + "\n")
    with pytest.raises(DataError, match="no texts"):
        load_texts(str(empty))
    with pytest.raises(DataError, match="file not found"):
        load_texts(str(tmp_path / "missing.jsonl"))
