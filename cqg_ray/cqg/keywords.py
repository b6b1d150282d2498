"""Cluster keywords: class-based TF-IDF (c-TF-IDF, as in BERTopic) of each cluster's texts against the other clusters'.

Each cluster's sampled texts are one class document; a word's weight in a cluster is its frequency there times
log(1 + A / f), A the mean word count of a class document and f the word's count over all of them. The property
prompt shows a cluster's top words (``cqg.keywords``), so the writer sees what the positives share beyond six excerpts.
"""

from __future__ import annotations

import numpy as np


def ctfidf(docs: list[list[str]], n: int, min_df: int = 2) -> list[list[str]]:
    """The ``n`` highest c-TF-IDF words of each class, best first (pure). ``docs[c]`` are class c's texts; a word must
    occur in at least ``min_df`` texts of the class (a word of one text is that text's, not the cluster's); English stop
    words, numbers and one-letter tokens are left out. Ties break alphabetically."""
    from sklearn.feature_extraction.text import CountVectorizer

    if n < 1 or not any(docs):
        return [[] for _ in docs]
    vec = CountVectorizer(stop_words="english", token_pattern=r"(?u)\b[^\W\d_][^\W\d_']+\b", lowercase=True, binary=True)
    try:
        vec.fit([t for d in docs for t in d])
    except ValueError:  # nothing but stop words
        return [[] for _ in docs]
    vocab = vec.get_feature_names_out()
    # per class: in how many of its texts each word occurs (binary per text, so one long text cannot dominate); sparse
    # throughout (classes x vocabulary is mostly zeros: a dense one is k x V floats, gigabytes at thousands of clusters)
    from scipy import sparse

    sizes = np.array([len(d) for d in docs])
    member = sparse.csr_matrix((np.ones(sizes.sum()), (np.repeat(np.arange(len(docs)), sizes), np.arange(sizes.sum()))),
                               shape=(len(docs), sizes.sum()))
    df = (member @ vec.transform([t for d in docs for t in d])).tocsr().astype(np.float64)
    rows = np.asarray(df.sum(axis=1)).ravel()
    idf = np.log1p(rows.mean() / np.maximum(np.asarray(df.sum(axis=0)).ravel(), 1))
    out = []
    for c in range(len(docs)):
        lo, hi = df.indptr[c], df.indptr[c + 1]
        cols, counts = df.indices[lo:hi], df.data[lo:hi]
        w = np.where(counts >= min_df, counts / max(rows[c], 1) * idf[cols], 0.0)
        order = np.lexsort((vocab[cols], -w))
        out.append([str(vocab[cols[j]]) for j in order[:n] if w[j] > 0])
    return out


def keyword_sample(members: np.ndarray, n: int, seed: int, cluster: int) -> np.ndarray:
    """Up to ``n`` of a cluster's members, drawn reproducibly (the texts its keywords are read from)."""
    if len(members) <= n:
        return np.sort(members)
    return np.sort(np.random.default_rng([seed, 5, cluster]).choice(members, n, replace=False))
