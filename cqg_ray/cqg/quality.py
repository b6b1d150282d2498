"""Question quality, measured: do the questions name properties many texts share, or copy one text?

    q = question_quality(questions, corpus_texts, embeddings=E, theta=0.8)
    q["copy_rate"], q["words_median"], q["words_max"], q["cut_off_share"], q["top_opening_share"], q["near_duplicate_share"]

- copy rate: the share of questions that share a run of ``COPY_WORDS`` (6) words with any text of the corpus;
- words per question, median and max;
- cut-off share: questions whose last word before "?" is a function word (``CUT_OFF_WORDS``: "Is the article about?");
- top opening share: the share of the most common opening (first four words), with that opening;
- near-duplicate share: questions whose embedding has cosine >= theta with another question's.
Words are lower-cased ``[a-z0-9']+`` tokens. Pure: lists and arrays in, numbers out; the corpus is streamed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

import numpy as np

COPY_WORDS = 6
OPENING_WORDS = 4
CUT_OFF_WORDS = frozenset("a an the of to in on at for with by from about and or as is was be being that which who his her their".split())
_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """Lower-cased ``[a-z0-9']+`` tokens."""
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int = COPY_WORDS) -> set[tuple[str, ...]]:
    return {tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)}


def copied(questions: list[str], corpus: Iterable[str], n: int = COPY_WORDS) -> np.ndarray:
    """Per question: whether it shares a run of ``n`` words with any text of ``corpus`` (streamed once)."""
    grams = [ngrams(words(q), n) for q in questions]
    owner: dict[tuple[str, ...], list[int]] = {}
    for i, g in enumerate(grams):
        for gram in g:
            owner.setdefault(gram, []).append(i)
    hit = np.zeros(len(questions), dtype=bool)
    if not owner:
        return hit
    for text in corpus:
        tokens = words(text)
        for i in range(len(tokens) - n + 1):
            found = owner.get(tuple(tokens[i: i + n]))
            if found is not None:
                hit[found] = True
    return hit


def cut_off(question: str) -> bool:
    """Whether the question ends on a function word before its "?" (a question cut short)."""
    head = question.rsplit("?", 1)[0] if "?" in question else question
    w = words(head)
    return bool(w) and w[-1] in CUT_OFF_WORDS


def opening(question: str, k: int = OPENING_WORDS) -> str:
    return " ".join(words(question)[:k])


def near_duplicates(embeddings: np.ndarray, theta: float) -> np.ndarray:
    """Per question: whether another question's (L2-normalised) embedding has cosine >= theta with it."""
    e = np.asarray(embeddings, dtype=np.float32)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    out = np.zeros(len(e), dtype=bool)
    for start in range(0, len(e), 1024):
        sims = e[start: start + 1024] @ e.T
        idx = np.arange(start, min(start + 1024, len(e)))
        sims[np.arange(len(idx)), idx] = -1.0  # not itself
        out[idx] = (sims >= theta).any(axis=1)
    return out


def question_quality(questions: list[str], corpus: Iterable[str] | None = None, embeddings: np.ndarray | None = None,
                     theta: float | None = None) -> dict:
    """The measures of the module docstring (copy rate without a corpus and near-duplicates without embeddings: None)."""
    if not questions:
        raise ValueError("no questions to measure")
    n_words = np.array([len(words(q)) for q in questions])
    openings = Counter(opening(q) for q in questions)
    top, top_n = openings.most_common(1)[0]
    out = {
        "questions": len(questions),
        "copy_rate": None if corpus is None else round(float(copied(questions, corpus).mean()), 4),
        "words_median": float(np.median(n_words)),
        "words_max": int(n_words.max()),
        "cut_off_share": round(float(np.mean([cut_off(q) for q in questions])), 4),
        "top_opening_share": round(top_n / len(questions), 4),
        "top_opening": top,
        "near_duplicate_share": None,
        "theta": theta,
    }
    if embeddings is not None and theta is not None:
        out["near_duplicate_share"] = round(float(near_duplicates(embeddings, theta).mean()), 4)
    return out


def format_quality(q: dict) -> str:
    """The report as plain ``name: value`` lines."""
    def f(v):
        return "n/a" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))

    return "\n".join([
        f"questions: {q['questions']}",
        f"copy_rate: {f(q['copy_rate'])}   (share sharing a run of {COPY_WORDS} words with a corpus text)",
        f"words_median: {q['words_median']:g}",
        f"words_max: {q['words_max']}",
        f"cut_off_share: {f(q['cut_off_share'])}   (ends on a function word before '?')",
        f"top_opening_share: {f(q['top_opening_share'])}   ({q['top_opening']!r})",
        f"near_duplicate_share: {f(q['near_duplicate_share'])}   (cosine >= theta = {q['theta']})",
    ])
