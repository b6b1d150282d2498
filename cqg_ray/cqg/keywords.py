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
    # per class: in how many of its texts each word occurs (binary per text, so one long text cannot dominate)
    df = np.vstack([np.asarray(vec.transform(d).sum(axis=0)).ravel() if d else np.zeros(len(vocab)) for d in docs])
    tf = df / np.maximum(df.sum(axis=1, keepdims=True), 1)
    idf = np.log1p(df.sum(axis=1).mean() / np.maximum(df.sum(axis=0), 1))
    w = np.where(df >= min_df, tf * idf, 0.0)
    out = []
    for c in range(len(docs)):
        order = np.lexsort((vocab, -w[c]))
        out.append([str(vocab[j]) for j in order[:n] if w[c, j] > 0])
    return out


def keyword_sample(members: np.ndarray, n: int, seed: int, cluster: int) -> np.ndarray:
    """Up to ``n`` of a cluster's members, drawn reproducibly (the texts its keywords are read from)."""
    if len(members) <= n:
        return np.sort(members)
    return np.sort(np.random.default_rng([seed, 5, cluster]).choice(members, n, replace=False))
