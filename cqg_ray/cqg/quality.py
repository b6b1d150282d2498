"""Question quality, measured: do the questions name properties many texts share, or copy one text?

    q = question_quality(questions, corpus_texts, embeddings=E, theta=0.8)
    q["copy_rate"], q["words_median"], q["words_max"], q["cut_off_share"], q["top_opening_share"], q["near_duplicate_share"]

- copy rate: the share of questions that share a run of ``COPY_WORDS`` (6) words with any text of the corpus;
- words per question, median and max;
- cut-off share: questions whose last word before "?" is a function word (``CUT_OFF_WORDS``: "Is the article about?");
- top opening share: the share of the most common opening (first four words), with that opening;
- near-duplicate share: questions whose embedding has cosine >= theta with another question's.
Words are lower-cased ``[a-z0-9']+`` tokens. The measures are pure (lists and arrays in, numbers out; the corpus is
streamed); ``model_quality`` reads a model folder, the model's encoder and the corpus the model was built from: the
one its ``run_config.yaml`` names (an exported or shipped model), or for a run's own model folder (``<run_dir>/model``)
that run's prepared corpus (else the corpus its ``config.yaml`` names).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, Iterable, Iterator

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


# ----------------------------------------------------------------------------------------- a model folder


def corpus_texts(paths: list[str], base: str | None = None, settings: Any = None) -> Iterator[str]:
    """Every text of the corpus files, streamed file by file; a relative path that does not exist here is tried
    against ``base`` (a model's checkout: models/<name>/../..). ``settings``: the ``CorpusConfig`` the files were
    read with (format, text column, ...; its paths are ignored); None = the defaults."""
    from cqg_ray.config import CorpusConfig
    from cqg_ray.corpus import CorpusError, list_files, parse_file, read_bytes

    found = []
    for p in paths:
        if "://" not in p and not os.path.exists(p) and base and os.path.exists(os.path.join(base, p)):
            p = os.path.join(base, p)
        found.append(p)
    cfg = CorpusConfig(paths=found) if settings is None else settings.model_copy(update={"paths": found})
    n = 0
    for uri, fmt in list_files(found, cfg.format):
        texts = parse_file(read_bytes(uri), fmt, uri, cfg).texts
        n += len(texts)
        yield from texts
    if not n:  # a copy rate over no texts would read as "copies nothing"
        raise CorpusError(f"no texts in {', '.join(paths)}: the copy rate needs a corpus with texts")


def model_run(folder: str) -> Any:
    """The run directory (a ``RunDir``) whose model stage a model folder is (``<run_dir>/model``, the run holding a
    ``config.yaml`` or a finished prepare stage), or None."""
    from cqg_ray.rundir import RunDir

    folder = folder.rstrip("/")
    if "://" in folder:
        parent, _, name = folder.rpartition("/")
        if "://" not in parent or parent.endswith(":/"):  # the model folder is a bucket's root
            return None
    else:
        folder = os.path.abspath(folder)
        parent, name = os.path.dirname(folder), os.path.basename(folder)
    if name != "model":
        return None
    run = RunDir(parent)
    return run if run.exists("config.yaml") or run.manifest("prepare") is not None else None


def model_quality(model: str, corpus: list[str] | None = None, encoder: Any = None) -> dict:
    """The measures for a model folder (or a shipped model's name) against ``corpus`` files, by default the corpus the
    model was built from (theta from the same config): the one its ``run_config.yaml`` read (an exported or shipped
    model); for a run's model folder (``<run_dir>/model``, no run_config.yaml) the run's prepared corpus, or where the
    run has no finished prepare stage the corpus its ``config.yaml`` names; with none of these, no copy rate.
    ``encoder``: the model's loaded encoder, to save loading it."""
    import yaml

    from cqg_ray.config import config_from_dict
    from cqg_ray.mbqa.folder import read_questions
    from cqg_ray.mbqa.folder import resolve_model
    from cqg_ray.rundir import RunDir

    folder = resolve_model(model)
    run = RunDir(folder)
    questions = [q["text"] for q in read_questions(run, folder)]
    own = None  # the run directory the folder is the model of (no run_config.yaml: not exported)
    if run.exists("run_config.yaml"):
        cfg = config_from_dict(yaml.safe_load(run.read_bytes("run_config.yaml")))
    else:
        from cqg_ray.pipeline import saved_config

        own = model_run(folder)
        cfg = (saved_config(own) if own is not None else None) or config_from_dict({})
    if encoder is None:
        from cqg_ray.encoder import load_encoder

        encoder = load_encoder(run.read_json("config.json")["encoder"])
    base = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
    texts: Iterable[str] | None = None  # no corpus: no copy rate
    if corpus:
        texts = corpus_texts(corpus, base=base)
    elif own is not None and own.manifest("prepare") is not None:
        from cqg_ray.artifacts import corpus_texts as prepared_texts

        texts = prepared_texts(own)
    elif cfg.corpus.paths:
        texts = corpus_texts(list(cfg.corpus.paths), base=base, settings=cfg.corpus if own is not None else None)
    return question_quality(questions, texts, encoder.encode(questions, batch_size=128), cfg.cqg.theta_value)
