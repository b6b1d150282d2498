"""bench/question_prior.py's person-side measure: the hand-answered pairs of the questions asked, once each, and the AUC
of a model's P(yes) against them."""

import json
from pathlib import Path

import numpy as np
from tests.scripts import load_script

qp = load_script("bench/question_prior.py", "bench_question_prior")
DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


def test_hand_pairs_are_the_asked_questions_answered_by_hand_once_each():
    asked = {"Is a person or animal mentioned?", "Is there a woman or girl mentioned in the text?"}
    pairs = qp.hand_pairs(asked)
    rows = [json.loads(line) for f in sorted(DATA.glob("hand_pairs_*.jsonl")) for line in f.read_text().splitlines()]
    first = {}
    for r in rows:
        if r["question"] in asked:
            first.setdefault((r["text"], r["question"]), r["answer"])
    assert sorted(pairs) == sorted((t, q, a) for (t, q), a in first.items()) and len(pairs) > 20
    assert {q for _, q, _ in pairs} == asked and qp.hand_pairs({"Is it a question no one asked?"}) == []


def test_hand_auc_ranks_the_models_probabilities_against_the_answers():
    """The shipped model on its own hand pairs: the AUC of its probabilities, as computed here pair by pair."""
    from sklearn.metrics import roc_auc_score

    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    model = InterpretableEmbedder.load("cqg-minilm-ref", device="cpu")
    pairs = qp.hand_pairs(set(model.questions[:40]))
    probs = model.encode([t for t, _, _ in pairs], output="probs", progress=False)
    col = {q: j for j, q in enumerate(model.questions)}
    want = roc_auc_score([a for _, _, a in pairs], [probs[i, col[q]] for i, (_, q, _) in enumerate(pairs)])
    assert abs(qp.hand_auc("cqg-minilm-ref", pairs) - want) < 1e-6 and len({a for _, _, a in pairs}) == 2
    assert isinstance(want, float) and np.isfinite(want)
