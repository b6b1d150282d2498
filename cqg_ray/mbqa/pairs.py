"""The training data: labelled (text row, question, answer) pairs, kept sparse, and the held-out split by document.

Labels are kept sparse (three flat arrays, 13 bytes a pair): the paper's data is 10,000 questions x 1,000 texts =
10 M pairs spread over millions of texts, so a dense (n_docs, m) matrix would be ~99.96% empty (1 M docs x 10k
questions = 10 GB of int8), while the pairs take 130 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cqg_ray.mbqa.label_plan import holdout_docs


@dataclass
class LabelPairs:
    """Sparse labels: pair p says text row `doc[p]` answers question `question[p]` with `answer[p]` (1 yes, 0 no)."""

    doc: np.ndarray  # int64 (n,)
    question: np.ndarray  # int32 (n,)
    answer: np.ndarray  # int8 (n,)
    n_questions: int
    target: np.ndarray | None = None  # float32 (n,) soft training targets in [0, 1] (P(yes)); None = the hard answers

    def __post_init__(self):
        self.doc = np.asarray(self.doc, dtype=np.int64)
        self.question = np.asarray(self.question, dtype=np.int32)
        self.answer = np.asarray(self.answer, dtype=np.int8)
        if not (len(self.doc) == len(self.question) == len(self.answer)):
            raise ValueError("doc, question and answer must have the same length")
        if self.target is not None:
            self.target = np.asarray(self.target, dtype=np.float32)
            if len(self.target) != len(self.doc) or not np.all((self.target >= 0) & (self.target <= 1)):
                raise ValueError("soft targets must be one probability in [0, 1] per pair")
        if len(self.doc) and (self.question.min() < 0 or self.question.max() >= self.n_questions):
            raise ValueError(f"question indices must lie in [0, {self.n_questions})")
        if len(self.doc) and self.doc.min() < 0:
            raise ValueError("doc indices must be >= 0")
        if not np.isin(self.answer, (0, 1)).all():
            raise ValueError("answers must be 0 (no) or 1 (yes)")

    def __len__(self) -> int:
        return len(self.doc)

    @classmethod
    def from_dense(cls, labels: np.ndarray) -> "LabelPairs":
        """From a dense (n_docs, m) int8 matrix with 1 yes, 0 no, -1 unlabelled."""
        labels = np.asarray(labels)
        if labels.ndim != 2:
            raise ValueError(f"dense labels must be (n_docs, m), got shape {labels.shape}")
        doc, question = np.nonzero(labels >= 0)
        return cls(doc, question, labels[doc, question], labels.shape[1])

    def to_dense(self, n_docs: int) -> np.ndarray:
        out = np.full((n_docs, self.n_questions), -1, dtype=np.int8)
        out[self.doc, self.question] = self.answer
        return out

    def select(self, keep: np.ndarray) -> "LabelPairs":
        return LabelPairs(self.doc[keep], self.question[keep], self.answer[keep], self.n_questions,
                          None if self.target is None else self.target[keep])

    @property
    def training_target(self) -> np.ndarray:
        """What the heads are fitted to: the soft targets when present, else the hard answers (float32)."""
        return self.answer.astype(np.float32) if self.target is None else self.target

    def auto_pos_weight(self) -> float:
        """#no / #yes (the paper's weighting); 1.0 when there is no yes at all."""
        yes = int(self.answer.sum())
        return (len(self) - yes) / yes if yes else 1.0


def split_holdout(pairs: LabelPairs, fraction: float, seed: int = 0) -> tuple[LabelPairs, LabelPairs]:
    """(training pairs, held-out pairs): every pair of a held-out document (`holdout_docs`) goes to the second."""
    is_held = np.isin(pairs.doc, holdout_docs(pairs.doc, fraction, seed))
    return pairs.select(~is_held), pairs.select(is_held)
