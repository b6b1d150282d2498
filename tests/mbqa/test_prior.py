"""The question prior without Ray: its logistic fit, its folding into the heads, and what it gives heads with few labels."""

import numpy as np
import pytest
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.label_plan import holdout_docs
from cqg_ray.mbqa.pairs import LabelPairs
from cqg_ray.mbqa.prior import PriorHeads, fit_prior, fold_prior, pair_cosines, unit_rows
from cqg_ray.mbqa.toy import make_problem
from tests.mbqa.conftest import train_locally


def test_fit_prior_is_the_logistic_regression_of_the_answers_on_the_cosines():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    cos = rng.uniform(-0.2, 0.8, 4000)
    answer = (rng.random(4000) < 1 / (1 + np.exp(-(5.0 * cos - 1.5)))).astype(np.float32)
    alpha, beta = fit_prior(cos, answer, ridge=0.0)
    lr = LogisticRegression(C=1e9, max_iter=10_000, tol=1e-12).fit(cos.reshape(-1, 1), answer)
    assert alpha == pytest.approx(lr.coef_[0, 0], abs=1e-4) and beta == pytest.approx(lr.intercept_[0], abs=1e-4)
    assert 4.5 < alpha < 5.5 and -1.8 < beta < -1.2
    # the workers' sums through all_reduce: here one worker whose reduce doubles its sums, as a twin shard would
    assert fit_prior(cos, answer, all_reduce=lambda t: 2 * t, ridge=0.0) == pytest.approx((alpha, beta), abs=1e-9)
    # one answer class only: the ridge keeps the fit finite
    a, b = fit_prior(cos, np.zeros_like(answer))
    assert np.isfinite([a, b]).all() and b < -3
    with pytest.raises(ValueError, match="no labelled pairs"):
        fit_prior(np.zeros(0), np.zeros(0))


def test_pair_cosines_are_each_pairs_text_against_its_question():
    rng = np.random.default_rng(1)
    emb, q = rng.standard_normal((7, 5)).astype(np.float32) * 3, unit_rows(rng.standard_normal((4, 5)))
    row, question = np.array([0, 6, 3, 3, 1]), np.array([2, 0, 3, 1, 2])
    want = [float(emb[r] @ q[k] / np.linalg.norm(emb[r])) for r, k in zip(row, question)]
    assert pair_cosines(emb, row, question, q, chunk=2) == pytest.approx(want, abs=1e-6)
    assert np.linalg.norm(q, axis=1) == pytest.approx(np.ones(4), abs=1e-6) and unit_rows(np.zeros((1, 3))).tolist() == [[0, 0, 0]]


def test_the_folded_heads_give_the_logits_that_trained():
    """fold_prior writes +-alpha q_i into two more hidden units of each head: on unit inputs the plain heads (hidden + 2)
    give PriorHeads' logits, grouped (training) and all-on-all (inference), so no loader or server knows of the prior."""
    torch.manual_seed(0)
    m, d, hidden, alpha, beta = 5, 12, 3, 4.2, -1.3
    heads = StackedHeads(d, m, hidden)
    q = torch.randn(m, d).numpy()
    x = torch.nn.functional.normalize(torch.randn(m, 6, d), dim=-1)
    with torch.no_grad():
        trained = PriorHeads(heads, q, alpha, beta)(x)
        folded = fold_prior(heads, q, alpha, beta)
        assert (folded.m, folded.d, folded.hidden) == (m, d, hidden + 2)
        assert torch.allclose(folded(x), trained, atol=1e-5)
        flat = x.reshape(-1, d)
        every = folded.forward_all(flat).view(m, 6, m)  # text (i, k) under head j
        assert torch.allclose(every[torch.arange(m), :, torch.arange(m)], trained, atol=1e-5)
        assert torch.allclose(StackedHeads.from_bytes(folded.to_bytes())(x), trained, atol=1e-5)  # saved as any heads
    with pytest.raises(ValueError, match=r"question vectors are \(4, 12\), the heads need \(5, 12\)"):
        fold_prior(heads, q[:4], alpha, beta)


def held_out_auc(with_prior: bool, per_question: int) -> float:
    from sklearn.metrics import roc_auc_score

    emb, dense, directions = make_problem(n_docs=600, d=16, m=8, per_question=per_question, seed=3, with_directions=True)
    pairs = LabelPairs.from_dense(dense)
    held = np.isin(pairs.doc, holdout_docs(pairs.doc, 0.5, seed=0))
    train = pairs.select(~held)
    cfg = TrainConfig(epochs=40, lr=1e-2, weight_decay=0.03)
    heads, _, _ = train_locally(emb, train, cfg, directions=directions if with_prior else None)
    test = pairs.select(held)
    with torch.no_grad():
        logit = heads.forward_pairs(torch.from_numpy(emb[test.doc]), torch.from_numpy(test.question.astype(np.int64))).numpy()
    return roc_auc_score(test.answer, logit)


def test_a_prior_that_points_the_right_way_lifts_heads_with_few_labels_and_costs_little_with_many():
    """Questions whose answers follow a direction, the prior knowing it (as a question's text knows its topic): with ~6
    labels a question to train on, heads beside the prior rank held-out texts far better than heads alone; with ~75,
    heads alone learn the direction too, and the prior still helps."""
    few = held_out_auc(False, 12), held_out_auc(True, 12)
    many = held_out_auc(False, 150), held_out_auc(True, 150)
    assert few[0] < 0.8 and few[1] > 0.97  # 0.73 -> 1.00 here
    assert many[0] > 0.93 and many[1] > 0.97  # 0.96 and 1.00
