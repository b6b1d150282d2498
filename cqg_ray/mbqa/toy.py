"""Small but real inputs that need no training or LLM: a model folder that the serving side's tests and the benchmarks
load, and a synthetic MBQA problem (`make_problem`).

    from cqg_ray.mbqa.toy import build_toy_model
    path = build_toy_model("/tmp/toy-model")        # bundled MiniLM + 32 hand-set heads
    model = InterpretableEmbedder.load(path)

Head i answers question q_i "yes" when the text's embedding points the way the question's own embedding does:

    C_i(e) = w2 . ReLU(W1_i e + b1_i) + b2_i = s * (cos(e, Enc(q_i)) - c)

(one live hidden unit: W1_i[0] = s Enc(q_i), b1_i[0] = s (2 - c) keeps it positive for any unit e, w2_i[0] = 1,
b2_i = -2 s; the other hidden units are zero). So sigma(C_i) > 1/2 exactly when cos(e, Enc(q_i)) > c. With the
bundled MiniLM and c = 0.15 about one text in ten answers a given question yes; the answers are crude but they
are what a real `InterpretableEmbedder` computes, through the real folder format. A trained model from the
pipeline (`runs/<name>/model`) replaces it everywhere.
"""

from __future__ import annotations

import numpy as np
import torch

from cqg_ray.encoder import load_encoder
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.mbqa.heads import StackedHeads

TOY_QUESTIONS = [
    "Is the text about health or medicine?",
    "Does the text discuss a movie or film?",
    "Is the text a review of a product?",
    "Is the text about food or cooking?",
    "Does the text describe scientific research?",
    "Is the text about politics or government?",
    "Is the text about computers or software?",
    "Does the text express a negative opinion?",
    "Does the text express a positive opinion?",
    "Is the text about animals or nature?",
    "Does the text mention a country or a city?",
    "Is the text about music or musicians?",
    "Is the text about travel or holidays?",
    "Does the text discuss education or schools?",
    "Is the text about law, police or crime?",
    "Does the text describe weather or climate?",
    "Is the text about cars or transport?",
    "Does the text mention family or relationships?",
    "Is the text about religion or faith?",
    "Is the text about history or the past?",
    "Does the text discuss a war or a military conflict?",
    "Is the text about the environment or pollution?",
    "Does the text discuss jobs or the workplace?",
    "Does the text ask a question?",
    "Does the text discuss money, prices or the economy?",
    "Is the text about books or literature?",
    "Does the text discuss sport or physical exercise?",
    "Is the text about space or astronomy?",
    "Does the text mention a company or a brand?",
    "Is the text about energy, oil or electricity?",
    "Does the text describe a person's feelings?",
    "Is the text about children or young people?",
]


def toy_heads(question_emb: torch.Tensor, cut: float = 0.15, scale: float = 25.0, hidden: int = 8) -> StackedHeads:
    """Stacked heads with C_i(e) = scale * (cos(e, question_emb[i]) - cut) for unit vectors e (see module doc)."""
    m, d = question_emb.shape
    heads = StackedHeads(d, m, hidden)
    with torch.no_grad():
        for p in heads.parameters():
            p.zero_()
        heads.w1[:, 0, :] = scale * question_emb
        heads.b1[:, 0] = scale * (2.0 - cut)
        heads.w2[:, 0] = 1.0
        heads.b2[:] = -2.0 * scale
    return heads


def toy_reliability(i: int) -> dict:
    """The measured-reliability fields of toy question i, all three kinds in turn: a measured precision, too few
    held-out labels (precision null), and none (a model that stores no figures)."""
    if i % 3 == 0:
        return {"precision": round(0.5 + i / 100, 4), "recall": 0.75, "base_rate": 0.3, "n_heldout": 10 + i, "heldout_yes": 3}
    if i % 3 == 1:
        return {"precision": None, "recall": None, "base_rate": 0.0, "n_heldout": 3, "heldout_yes": 0}
    return {}


def build_toy_model(path: str, questions: list[str] | None = None, encoder: str = "bundled:all-MiniLM-L6-v2",
                    cut: float = 0.15, scale: float = 25.0, tau: float = 0.5, encoder_model=None) -> str:
    """Write a model folder at `path` (question ids q000, q001, ...) and return `path`."""
    questions = list(questions or TOY_QUESTIONS)
    enc = encoder_model if encoder_model is not None else load_encoder(encoder, device="cpu")
    q_emb = torch.from_numpy(enc.encode(questions))
    heads = toy_heads(q_emb, cut=cut, scale=scale)
    records = [{"id": f"q{i:03d}", "text": q, "cluster": i, **toy_reliability(i)} for i, q in enumerate(questions)]
    InterpretableEmbedder(encoder, records, heads, tau=tau, device="cpu", encoder=enc).save(path)
    return path


def make_problem(n_docs=400, d=16, m=6, per_question=150, seed=0, with_directions=False):
    """Unit embeddings; question i is 'yes' when the projection on a random direction exceeds a threshold
    (25% yes over the corpus); each question is labelled on `per_question` random texts. Returns (embeddings, dense int8
    labels), and with ``with_directions`` the questions' directions (m, d) too (a question prior that knows the truth's axis)."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n_docs, d)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    directions = rng.standard_normal((m, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    proj = emb @ directions.T
    truth = (proj > np.quantile(proj, 0.75, axis=0)).astype(np.int8)
    labels = np.full((n_docs, m), -1, dtype=np.int8)
    for q in range(m):
        docs = rng.choice(n_docs, per_question, replace=False)
        labels[docs, q] = truth[docs, q]
    return (emb, labels, directions.astype(np.float32)) if with_directions else (emb, labels)
