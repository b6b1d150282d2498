"""The faithfulness task: its sampling and figures (pure), and the whole task on a real model folder with a scripted judge
whose answers are known, so that the figures come out exactly."""

import json

import numpy as np
import pytest

from cqg_ray.config import EvaluateConfig, FaithfulnessConfig, JudgeLLMConfig
from cqg_ray.evaluate.faithfulness import faithfulness, figures, format_faithfulness, nearest_pairs, sample_questions, sample_texts
from cqg_ray.llm.base import Completion
from cqg_ray.llm.engines.fake import FakeBackend
from cqg_ray.llm.prompts import judge_messages

TEXTS = [
    "The hospital opened a new wing for heart surgery.",
    "A thrilling film with a weak ending.",
    "Grilled salmon with lemon and herbs.",
    "Parliament passed the budget after a long debate.",
    "The new laptop runs the software smoothly.",
    "A quiet walk through the forest at dawn.",
    "Doctors warn about the flu season.",
    "The band played their greatest hits in Paris.",
]


# ----------------------------------------------------------------------------------------- pure core


def test_sample_texts_is_seeded_sorted_and_capped():
    a = sample_texts(100, 10, seed=3)
    assert a.tolist() == sorted(a.tolist()) and len(set(a.tolist())) == 10
    assert a.tolist() == sample_texts(100, 10, seed=3).tolist() != sample_texts(100, 10, seed=4).tolist()
    assert sample_texts(4, 10, seed=0).tolist() == [0, 1, 2, 3]


def test_sample_questions_takes_everything_when_the_pools_are_small():
    act = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    assert sample_questions(act, per_text=5, seed=0) == [
        (0, 0, True), (0, 2, True), (0, 1, False), (0, 3, False),
        (1, 0, False), (1, 1, False), (1, 2, False), (1, 3, False),
        (2, 0, True), (2, 1, True), (2, 2, True), (2, 3, True),
    ]


def test_sample_questions_is_random_not_the_first_ones():
    act = np.zeros((50, 40), dtype=bool)
    act[:, :20] = True  # 20 active, 20 inactive per text
    picks = sample_questions(act, per_text=5, seed=0)
    assert len(picks) == 50 * 10
    for row in range(50):
        mine = [(q, a) for r, q, a in picks if r == row]
        assert sum(a for _, a in mine) == 5 and sum(not a for _, a in mine) == 5
        assert all(q < 20 for q, a in mine if a) and all(q >= 20 for q, a in mine if not a)
    chosen = {q for _, q, a in picks if a}
    assert chosen == set(range(20))  # over 50 texts every active question is drawn somewhere, not always the first 5
    assert picks == sample_questions(act, per_text=5, seed=0) != sample_questions(act, per_text=5, seed=1)


def test_figures_are_the_yes_rates_and_their_balanced_accuracy():
    active = [True] * 4 + [False] * 6
    judge = [True, True, True, False] + [True, False, False, False, False, False]
    f = figures(active, judge)
    assert f["faithfulness_yes_precision"] == 0.75
    assert f["faithfulness_inactive_yes_rate"] == pytest.approx(1 / 6)
    assert f["faithfulness_balanced_accuracy"] == pytest.approx((0.75 + 1 - 1 / 6) / 2)
    assert (f["judged_active"], f["judged_inactive"]) == (4, 6)
    none = figures([False, False], [True, False])
    assert none["faithfulness_yes_precision"] is None and none["faithfulness_balanced_accuracy"] is None
    assert none["faithfulness_inactive_yes_rate"] == 0.5


def test_nearest_pairs_by_binary_cosine_skip_texts_without_yes():
    act = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1]], dtype=bool)
    # row 0: cos with 2 = 1/sqrt2 = 0.707, with 3 = 2/sqrt6 = 0.816 -> 3; row 1 has no yes; row 2: with 0 = 0.707,
    # with 3 = 0.577 -> 0; row 3: with 0 = 0.816 -> 0
    assert nearest_pairs(act, 3) == [(0, 3), (2, 0), (3, 0)]
    assert nearest_pairs(act, 0) == []


# ----------------------------------------------------------------------------------------- the task, on a real model


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from tests.serve.toy_model import build_toy_model

    return InterpretableEmbedder.load(build_toy_model(str(tmp_path_factory.mktemp("toy") / "model")), device="cpu")


def scripted_judge(yes_questions: set[str]):
    """A judge that says yes exactly to the questions in ``yes_questions``, whatever the text."""
    cfg = JudgeLLMConfig(backend="fake")

    def reply(req):
        question = req.messages[0]["content"].rsplit("\n\nQuestion: ", 1)[1]
        p = 0.9 if question in yes_questions else 0.1
        return Completion("yes" if p > 0.5 else "no", prompt_tokens=10, p_yes=[p])

    return cfg, FakeBackend(cfg, reply=reply)


def test_faithfulness_figures_come_out_exactly_with_a_known_judge(toy, tmp_path):
    qs = toy.questions
    yes = set(qs[::2])  # the judge confirms every even-numbered question, on any text
    judge_cfg, backend = scripted_judge(yes)
    cfg = FaithfulnessConfig(n=len(TEXTS), per_text=toy.m, pairs=2, judge=judge_cfg)  # per_text = m: every question judged
    res = faithfulness(toy, TEXTS, cfg, str(tmp_path / "ledger"), backend=backend, progress=False)

    bits = toy.encode(TEXTS, progress=False).astype(bool)  # the model's default output, computed here independently
    even = np.zeros(toy.m, dtype=bool)
    even[::2] = True
    x = (bits & even).sum() / bits.sum()
    y = (~bits & even).sum() / (~bits).sum()
    assert (res["judged_active"], res["judged_inactive"]) == (int(bits.sum()), int((~bits).sum()))
    assert res["faithfulness_yes_precision"] == pytest.approx(x, abs=1e-12)
    assert res["faithfulness_inactive_yes_rate"] == pytest.approx(y, abs=1e-12)
    assert res["faithfulness_balanced_accuracy"] == pytest.approx((x + 1 - y) / 2, abs=1e-12)
    assert res["texts"] == len(TEXTS) and res["texts_without_active"] == int((~bits.any(axis=1)).sum())
    assert bits.sum() > 0 and (~bits).sum() > 0

    # the judge was asked the plain prompt, single-pass, once per (text, question)
    first = backend.calls[0]
    assert first.yes_no and first.answer_prefix == "" and first.max_tokens == 1
    assert any(c.messages == judge_messages(TEXTS[0], qs[0]) for c in backend.calls)
    assert len(backend.calls) == len(TEXTS) * toy.m

    # explained pairs: built as explain builds them, each shown shared question with the judge's verdict on both texts
    assert len(res["pairs"]) == 2
    for p in res["pairs"]:
        ex = toy.explain(p["text_a"], p["text_b"])
        assert [s["index"] for s in p["shared"]] == [q.index for q in ex.shared_yes][: cfg.pair_questions]
        assert p["cognitive_load"] == ex.cognitive_load
        assert all(s["judge_a"] == s["judge_b"] == (s["question"] in yes) for s in p["shared"])

    lines = format_faithfulness("toy on T", res).splitlines()
    assert lines[1:] == [f"faithfulness_yes_precision: {x:.4f}", f"faithfulness_inactive_yes_rate: {y:.4f}",
                         f"faithfulness_balanced_accuracy: {(x + 1 - y) / 2:.4f}"]


def test_faithfulness_samples_at_most_per_text_and_resumes_without_asking_again(toy, tmp_path):
    judge_cfg, backend = scripted_judge(set(toy.questions[:5]))
    cfg = FaithfulnessConfig(n=6, per_text=2, pairs=0, judge=judge_cfg)
    res = faithfulness(toy, TEXTS, cfg, str(tmp_path), seed=1, backend=backend, progress=False)
    rows = sample_texts(len(TEXTS), 6, seed=1)
    bits = toy.encode([TEXTS[i] for i in rows], progress=False).astype(bool)
    assert res["judged_active"] == int(np.minimum(bits.sum(axis=1), 2).sum())
    assert res["judged_inactive"] == int(np.minimum((~bits).sum(axis=1), 2).sum())
    assert len(backend.calls) == res["judged_active"] + res["judged_inactive"]
    assert [j["active"] for j in res["judgements"]].count(True) == res["judged_active"]

    again_cfg, again = scripted_judge(set(toy.questions[:5]))
    res2 = faithfulness(toy, TEXTS, cfg, str(tmp_path), seed=1, backend=again, progress=False)
    assert again.calls == []  # every judgement came from the ledger
    assert {k: res2[k] for k in ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate")} == \
        {k: res[k] for k in ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate")}


def test_a_failing_judge_is_a_clear_error(toy, tmp_path):
    cfg = FaithfulnessConfig(n=2, per_text=1, pairs=0, judge=JudgeLLMConfig(backend="fake", max_attempts=1))
    broken = FakeBackend(cfg.judge, reply=lambda req: Completion("", error="server said 500"))
    with pytest.raises(RuntimeError, match="the judge failed on 4 of 4 judgements"):
        faithfulness(toy, TEXTS, cfg, str(tmp_path), backend=broken, progress=False)


def test_evaluate_with_the_faithfulness_task_writes_figures_quality_and_the_judge(toy, tmp_path, capsys):
    from cqg_ray.evaluate.report import evaluate_model

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = EvaluateConfig(tasks=["faithfulness"], faithfulness=FaithfulnessConfig(texts=[str(texts)], n=4, pairs=1,
                                                                                judge=JudgeLLMConfig(backend="fake")))
    out = tmp_path / "report"
    res = evaluate_model({"Toy": toy}, cfg, str(out), print_table=True)
    f = res["faithfulness"]["Toy"]["texts"]
    assert f["texts"] == 4 and f["judge"] == "fake fake"
    assert set(res["methods"]) == {"Toy"}  # no baselines without a table task
    assert res["datasets"]["faithfulness"]["texts"] == {"path": str(texts), "texts": len(TEXTS)}
    stored = json.loads((out / "results.json").read_text())
    assert stored["faithfulness"]["Toy"]["texts"]["faithfulness_balanced_accuracy"] == f["faithfulness_balanced_accuracy"]
    q = stored["question_quality"]["Toy"]
    assert q["questions"] == toy.m and q["copy_rate"] is None  # the toy folder names no corpus
    report = (out / "report.md").read_text()
    assert "## Faithfulness" in report and "Judge: fake fake." in report and "## Question quality" in report
    printed = capsys.readouterr().out
    assert f"faithfulness_yes_precision: {f['faithfulness_yes_precision']:.4f}" in printed
    assert (out / "faithfulness" / "llm" / "ledger" / "faithfulness" / "_stats.json").exists()


def test_cli_faithfulness_options():
    import argparse

    from cqg_ray.evaluate.cli import add_commands, config_from_args

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evaluate", "m", "--tasks", "faithfulness", "--texts", "a.jsonl", "--n", "20", "--per-text", "3",
                              "--pairs", "1", "--judge", "/models/judge.gguf"])
    cfg = config_from_args(args)
    f = cfg.faithfulness
    assert cfg.tasks == ["faithfulness"] and f.texts == ["a.jsonl"] and (f.n, f.per_text, f.pairs) == (20, 3, 1)
    assert f.judge.backend == "llamacpp" and f.judge.llamacpp.model == "/models/judge.gguf"
    args = parser.parse_args(["evaluate", "m", "--tasks", "faithfulness", "--judge", "Qwen/Qwen2.5-7B-Instruct",
                              "--set", "evaluate.faithfulness.judge.backend=openai"])
    f = config_from_args(args).faithfulness
    assert f.judge.openai.model == "Qwen/Qwen2.5-7B-Instruct" and f.judge.llamacpp.model == "bundled:qwen2.5-coder-1.5b"
    default = config_from_args(parser.parse_args(["evaluate", "m"]))
    assert default.tasks == ["sts", "retrieval", "clustering"] and default.faithfulness.judge.llamacpp.model == "bundled:qwen2.5-coder-1.5b"
