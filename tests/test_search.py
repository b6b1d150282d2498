"""Search on packed binary embeddings: popcount cosine and chunked top-k against a brute force on unpacked vectors."""

import math

import numpy as np
import pytest

from cqg_ray.embed import embed_output_table
from cqg_ray.explain import binary_cosine
from cqg_ray.search import (BinaryIndex, SparseIndex, cosine_scores, popcounts, search_chunks, search_value_chunks, shared_questions,
                             to_words)


def cosine_of_bits(a, b) -> float:
    """|a AND b| / sqrt(|a| |b|) of two unpacked 0/1 vectors, one pair at a time (0 when either is all zeros)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    na, nb = int(a.sum()), int(b.sum())
    return float((a & b).sum() / math.sqrt(na * nb)) if na and nb else 0.0


def brute_force(query_bits, bits, k):
    """Cosine of unpacked 0/1 vectors one pair at a time, sorted by (-score, row)."""
    scores = [cosine_of_bits(query_bits, b) for b in bits]
    order = sorted(range(len(bits)), key=lambda i: (-scores[i], i))[:k]
    return [(i, scores[i]) for i in order]


def random_bits(n, m, density, seed):
    rng = np.random.default_rng(seed)
    return (rng.random((n, m)) < density).astype(np.uint8)


def test_to_words_and_popcounts():
    bits = random_bits(50, 77, 0.3, 0)
    words = to_words(np.packbits(bits, axis=1))
    assert words.dtype == np.uint64 and words.shape == (50, 2)
    assert popcounts(words).tolist() == bits.sum(axis=1).tolist()


@pytest.mark.parametrize("m", [8, 29, 64, 130])
def test_cosine_scores_equal_brute_force(m):
    bits = random_bits(300, m, 0.2, m)
    bits[7] = 0  # a document with no yes
    q = random_bits(1, m, 0.25, 99)[0]
    scores, inter = cosine_scores(to_words(np.packbits(q))[0], to_words(np.packbits(bits, axis=1)))
    assert scores.tolist() == [cosine_of_bits(q, b) for b in bits]
    assert [binary_cosine(q, b) for b in bits] == scores.tolist()
    assert inter.tolist() == (bits & q).sum(axis=1).tolist()
    assert scores[7] == 0.0
    zero_q = np.zeros(m, np.uint8)
    s0, _ = cosine_scores(to_words(np.packbits(zero_q))[0], to_words(np.packbits(bits, axis=1)))
    assert s0.tolist() == [0.0] * 300


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 10_000])
def test_index_search_matches_brute_force_with_ties(chunk_rows):
    m = 21
    bits = random_bits(500, m, 0.15, 1)  # few bits: many exactly equal scores
    q = random_bits(1, m, 0.3, 2)[0]
    index = BinaryIndex(np.array([f"d{i}" for i in range(500)]), np.packbits(bits, axis=1), m)
    for k in (1, 10, 37, 600):
        hits = index.search(np.packbits(q), k=k, chunk_rows=chunk_rows)
        expected = brute_force(q, bits, k)
        assert [(h.doc_id, h.score) for h in hits] == [(f"d{i}", s) for i, s in expected]
        assert [h.rank for h in hits] == list(range(1, len(expected) + 1))
        for h in hits:
            i = int(h.doc_id[1:])
            assert h.shared == np.flatnonzero(bits[i] & q).tolist()
            assert h.cognitive_load == len(h.shared)


def test_search_chunks_streams_files_in_order():
    m = 16
    bits = random_bits(90, m, 0.3, 5)
    q = random_bits(1, m, 0.3, 6)[0]
    ids = np.array([f"x{i:03d}" for i in range(90)])
    packed = np.packbits(bits, axis=1)
    chunks = [(ids[i : i + 25], packed[i : i + 25]) for i in range(0, 90, 25)] + [(ids[:0], packed[:0])]
    hits = search_chunks(np.packbits(q), chunks, m, k=15)
    assert [(h.doc_id, h.score) for h in hits] == [(ids[i], s) for i, s in brute_force(q, bits, 15)]


def test_shared_questions():
    a = np.array([1, 1, 0, 1, 0, 0, 0, 0, 1], np.uint8)
    b = np.array([1, 0, 0, 1, 1, 0, 0, 0, 1], np.uint8)
    assert shared_questions(np.packbits(a), np.packbits(b), 9) == [0, 3, 8]


def test_value_chunks_search_equals_the_whole_index_ties_to_the_earlier_document():
    rng = np.random.default_rng(5)
    X = ((rng.random((50, 12)) > 0.6) * rng.choice([0.5, 1.0], (50, 12))).astype(np.float32)
    X[30] = X[41] = X[3]  # ties, in other chunks
    ids = np.array([f"d{i}" for i in range(50)], dtype=object)
    whole = SparseIndex(ids, X, 12).search(X[3], 7)
    assert [h.doc_id for h in whole[:3]] == ["d3", "d30", "d41"] and whole[0].score == pytest.approx(1.0)
    for rows in (1, 7, 16, 50):
        got = search_value_chunks(X[3], ((ids[i : i + rows], X[i : i + rows]) for i in range(0, 50, rows)), 12, 7)
        assert [(h.rank, h.doc_id, h.score, h.shared) for h in got] == [(h.rank, h.doc_id, h.score, h.shared) for h in whole]
    assert search_value_chunks(X[3], iter([]), 12, 7) == []


def test_index_rejects_bad_shapes():
    with pytest.raises(ValueError, match="ceil"):
        BinaryIndex(np.array(["a"]), np.zeros((1, 3), np.uint8), m=8)
    with pytest.raises(ValueError, match="ids"):
        BinaryIndex(np.array(["a", "b"]), np.zeros((1, 1), np.uint8), m=8)


def test_embed_output_table_roundtrip_metadata():
    from cqg_ray.artifacts import embed_table_meta, embedding_matrix

    bits = random_bits(4, 12, 0.5, 3)
    b = {"rule": "tau", "tau": 0.4, "value": "one"}
    t = embed_output_table(["a", "b", "c", "d"], np.packbits(bits, axis=1), "bits", 12, b, 0.4)
    assert embed_table_meta(t.schema) == {"format": "cqg-ray-embeddings", "m": 12, "output": "bits", "budget": b, "tau": 0.4}
    assert np.array_equal(np.unpackbits(embedding_matrix(t.column("embedding")), axis=1, count=12), bits)
    p = embed_output_table(["a"], np.array([[0.25] * 12]), "probs", 12, b, 0.5)
    assert p.schema.field("embedding").type.value_type == "halffloat"
    with pytest.raises(ValueError, match="bytes per row"):
        embed_output_table(["a"], np.zeros((1, 3), np.uint8), "bits", 12, b, 0.5)


def test_sparse_table_round_trip():
    import scipy.sparse as sp

    from cqg_ray.artifacts import sparse_matrix

    X = sp.csr_array(np.array([[0, 0.5, 0, -0.25], [0, 0, 0, 0], [1, 0, 0, 0.125]], np.float32))
    t = embed_output_table(["a", "b", "c"], X, "sparse", 4, {"rule": "top_k", "k": 2, "floor": None, "value": "centred"}, 0.5)
    assert t.column("indices").to_pylist() == [[1, 3], [], [0, 3]]
    assert t.column("values").to_pylist() == [[0.5, -0.25], [], [1.0, 0.125]]  # float16 holds these exactly
    assert np.array_equal(sparse_matrix(t, 4).toarray(), X.toarray())
    assert np.array_equal(sparse_matrix(t.slice(1), 4).toarray(), X.toarray()[1:])
    with pytest.raises(ValueError, match="m=5"):
        embed_output_table(["a", "b", "c"], X, "sparse", 5, {}, 0.5)


def test_sparse_index_search_equals_brute_force():
    """The inverted index reads only the query's postings; its top-k equals a full cosine over dense vectors, ties
    to the earlier document."""
    import scipy.sparse as sp

    rng = np.random.default_rng(7)
    n, m = 800, 40
    dense = np.where(rng.random((n, m)) < 0.1, rng.choice([0.25, 0.5, -0.25], size=(n, m)), 0).astype(np.float32)
    dense[5] = dense[9]  # an exact tie
    index = SparseIndex(np.array([f"d{i}" for i in range(n)]), sp.csr_array(dense), m)
    for qseed in range(5):
        q = np.where(rng.random(m) < 0.2, rng.random(m), 0).astype(np.float32)
        norms = np.linalg.norm(dense, axis=1)
        scores = np.where(norms > 0, dense @ q / np.where(norms > 0, norms, 1) / np.linalg.norm(q), 0)
        for k in (1, 10, 900):
            want = sorted(range(n), key=lambda i: (-scores[i], i))[:k]
            hits = index.search(q, k)
            assert [h.doc_id for h in hits] == [f"d{i}" for i in want]
            assert [h.score for h in hits] == pytest.approx(scores[want].tolist(), abs=1e-6)
            for h in hits[:20]:  # surest first: by q_i * x_i, ties to the lower question
                x = dense[int(h.doc_id[1:])]
                assert h.shared == sorted(np.flatnonzero((q != 0) & (x != 0)).tolist(), key=lambda i: (-float(q[i]) * float(x[i]), i))
    assert [h.score for h in index.search(np.zeros(m, np.float32), 3)] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="m=40"):
        index.search(np.zeros(5), 3)


def test_search_says_an_unfinished_embed_output_is_one(tmp_path, capsys):
    """A folder where `cqg-ray embed` stopped (its settings, no manifest) is named unfinished, with the command that
    finishes it; any other folder is not an embed output."""
    from cqg_ray.cli import main
    from cqg_ray.mbqa.toy import build_toy_model

    model = build_toy_model(str(tmp_path / "model"))
    capsys.readouterr()  # what building it logged
    out = tmp_path / "emb"
    assert main(["search", model, str(out), "a query"]) == 2  # it read "not a cqg-ray embed output"
    assert capsys.readouterr().err == f"error: {out}: no such folder; give the OUT folder `cqg-ray embed MODEL CORPUS OUT` wrote\n"
    assert main(["search", model, model, "a query"]) == 2  # it suggested `cqg-ray embed MODEL CORPUS <the model folder>`
    assert capsys.readouterr().err == (f"error: {model} is a model folder (config.json), not an embed output; give the OUT folder "
                                       "`cqg-ray embed MODEL CORPUS OUT` wrote\n")
    out.mkdir()
    assert main(["search", model, str(out), "a query"]) == 2
    assert capsys.readouterr().err == (f"error: {out}: not a cqg-ray embed output (no _manifest.json); run `cqg-ray embed MODEL CORPUS "
                                       f"{out}` (again) first\n")
    (out / "_settings.json").write_text("{}")
    assert main(["search", model, str(out), "a query"]) == 2
    assert capsys.readouterr().err == (f"error: {out}: unfinished (no _manifest.json); run `cqg-ray embed MODEL CORPUS {out}` (again) "
                                       "first\n")
    run_dir = tmp_path / "run"  # a pipeline's run directory, which embed refuses as OUT: not suggested as one
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("run_dir: run\n")
    assert main(["search", model, str(run_dir), "a query"]) == 2
    assert capsys.readouterr().err == (f"error: {run_dir} is a pipeline run directory (config.yaml), not an embed output; embed a "
                                       "corpus into a folder of its own (`cqg-ray embed MODEL CORPUS OUT`) and give that OUT\n")
    # a query of bytes that are not UTF-8 (the shell's $'caf\xe9', a lone surrogate in argv): said as explain says it
    assert main(["search", model, str(out), "caf\udce9"]) == 2
    assert capsys.readouterr().err == "error: search: the query is not valid Unicode (an unpaired surrogate at character 3)\n"


class FakeModel:
    """What ``search`` asks of a model: m, its question records and a sparse encode (here a fixed value vector per text)."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors, self.m = vectors, len(next(iter(vectors.values())))
        self.question_records = [{"text": f"question {i}?"} for i in range(self.m)]

    def encode(self, texts, output, budget=None, progress=None):
        import scipy.sparse as sp

        assert output == "sparse"
        return sp.csr_array(np.array([self.vectors[t] for t in texts], np.float32))


def test_search_past_the_corpus_gives_its_documents_ranked_with_the_shared_questions_surest_first():
    """k above the number of documents: each document once, best first, no padding; each hit's shared questions in
    the order `explain` gives them (by p_query * p_doc, ties to the lower index), their texts alongside."""
    from cqg_ray.explain import explanation
    from cqg_ray.search import search

    p = {"query": [0.75, 0.5625, 0.9375, 0, 0.875, 0.625],
         "a": [0.625, 0, 0.5625, 0.9375, 0.625, 0.875],
         "b": [0.9375, 0.75, 0, 0, 0, 0],
         "c": [0, 0, 0, 0.75, 0, 0]}  # shares no question with the query: score 0, still a hit
    model = FakeModel(p)
    index = SparseIndex(np.array(["a", "b", "c"]), model.encode(["a", "b", "c"], "sparse"), model.m)
    hits = search(model, index, "query", k=10)
    assert [(h.rank, h.doc_id) for h in hits] == [(1, "a"), (2, "b"), (3, "c")]
    assert hits[0].score > hits[1].score > hits[2].score == 0.0
    assert [h.shared for h in hits] == [[4, 5, 2, 0], [0, 1], []]  # a: 0.875*0.625 = 0.625*0.875 > 0.9375*0.5625 > 0.75*0.625
    assert hits[0].questions == ["question 4?", "question 5?", "question 2?", "question 0?"] and hits[0].cognitive_load == 4
    for h in hits:
        pq, pd = np.array(p["query"]), np.array(p[h.doc_id])
        ex = explanation(pq, pd, pq > 0, pd > 0, pq, pd, model.question_records, "prob")
        assert h.shared == [a.index for a in ex.shared_yes]
    assert [h.doc_id for h in index.search(np.array(p["query"], np.float32), 3)] == ["a", "b", "c"]


def test_texts_in_memory_are_searched_as_the_docs_show():
    """docs/serving.md's in-memory search, verbatim, on the shipped model: no embed run, the texts as their own ids."""
    from cqg_ray import InterpretableEmbedder
    from cqg_ray.search import search

    model = InterpretableEmbedder.load("cqg-minilm-ref")
    docs = ["A man is playing a guitar.", "The stock market fell today.", "A dog runs in the park."]
    index = SparseIndex(np.array(docs), model.encode(docs, output="sparse"), model.m)
    hits = search(model, index, "Someone plays music.", k=2)
    assert [h.doc_id for h in hits] == ["A man is playing a guitar.", "A dog runs in the park."]
    assert hits[0].score > hits[1].score > 0 and "Is a musical performance described?" in hits[0].questions
    assert hits[1].questions == ["Is a person or animal mentioned?", "Is a person or animal shown in the text?"]
    last = search(model, index, "Someone plays music.", k=3)[2]  # the shipped model's music query shares nothing with the market
    assert (last.doc_id, last.score, last.questions) == ("The stock market fell today.", 0.0, [])


def test_a_long_query_or_text_is_clipped_where_a_line_shows_it():
    from cqg_ray.search import clipped

    assert clipped("a short query", 100) == "a short query"
    assert clipped("x" * 100, 100) == "x" * 100
    assert clipped("word " * 26_000, 200) == ("word " * 40)[:197] + "... (130,000 characters)"
    assert clipped("Line one\nLine two\t and  three\n", 100) == "Line one Line two and three"  # one hit, one line
