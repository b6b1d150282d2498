import numpy as np
import pytest

from cqg_ray.mbqa.report import classification_report, format_report

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def sklearn_report(y_true, y_pred):
    return sklearn_metrics.classification_report(y_true, y_pred, labels=[0, 1], target_names=["no", "yes"],
                                                 output_dict=True, zero_division=0)


@pytest.mark.parametrize("case", ["random", "all_yes_predicted", "no_yes_at_all"])
def test_matches_sklearn(case):
    rng = np.random.default_rng(0)
    y_true = (rng.random(500) < 0.12).astype(np.int8)
    y_pred = np.where(rng.random(500) < 0.9, y_true, 1 - y_true).astype(np.int8)
    if case == "all_yes_predicted":
        y_pred[:] = 1
    if case == "no_yes_at_all":
        y_true[:] = 0
    ours, ref = classification_report(y_true, y_pred), sklearn_report(y_true, y_pred)
    assert ours["accuracy"] == pytest.approx(ref["accuracy"])
    for key in ("no", "yes", "macro avg", "weighted avg"):
        for stat in ("precision", "recall", "f1-score", "support"):
            assert ours[key][stat] == pytest.approx(ref[key][stat]), (key, stat)


def test_by_hand_and_markdown():
    r = classification_report([0, 0, 0, 1, 1], [0, 0, 1, 1, 0])
    assert r["no"] == {"precision": 2 / 3, "recall": 2 / 3, "f1-score": pytest.approx(2 / 3), "support": 3}
    assert r["yes"]["precision"] == 0.5 and r["yes"]["support"] == 2
    assert r["accuracy"] == 0.6
    md = format_report(r)
    assert "| Weighted Avg |" in md and "| Accuracy | 0.60 |" in md


def test_bad_input_raises():
    with pytest.raises(ValueError, match="0 \\(no\\) or 1"):
        classification_report([0, 2], [0, 1])
    with pytest.raises(ValueError, match="differ"):
        classification_report([0, 1], [0])
