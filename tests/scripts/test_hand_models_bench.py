"""bench/hand_models.py: each model's sample is seeded, the merged file asks a pair once, score re-draws the samples."""

import json

import numpy as np
import pytest
from tests.scripts import load_script

hm = load_script("bench/hand_models.py", "bench_hand_models")


def test_texts_from_results_in_order_once_or_from_jsonl(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"faithfulness": {"M": {"STS-B": {"judgements": [{"text": t} for t in ("b", "a", "b", "c")]}}}}))
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n\n{"text": "y"}\n')
    assert hm.read_texts(str(path)) == ["b", "a", "c"] and hm.read_texts(str(tmp_path / "t.jsonl")) == ["x", "y"]


def test_sample_is_seeded_and_at_most_what_there_is():
    pairs = {(r, f"q{j}") for r in range(5) for j in range(3)}
    one, again = hm.sample(pairs, 4, np.random.default_rng(1)), hm.sample(pairs, 4, np.random.default_rng(1))
    assert one == again and len(set(one)) == 4 and set(one) <= pairs
    assert sorted(hm.sample(pairs, 99, np.random.default_rng(0))) == sorted(pairs)
    assert hm.precision([True, False, True, True]) == (0.75, pytest.approx(np.sqrt(0.75 * 0.25 / 4)))


def test_draw_then_score_gives_each_models_precision_over_its_own_sample(tmp_path, monkeypatch, capsys):
    """Two models shown on the same texts (here the shipped model at two budgets, as two folders): the merged draw asks
    each pair once; answering yes exactly the pairs of A's sample gives A 1.0 and B the share of its sample A drew too."""
    import shutil

    from cqg_ray.mbqa.folder import resolve_model

    a = tmp_path / "a"
    shutil.copytree(resolve_model("cqg-minilm-ref"), a, ignore=shutil.ignore_patterns("evaluation"))
    b = tmp_path / "b"
    shutil.copytree(a, b)
    cfg = json.loads((b / "config.json").read_text())
    cfg["budget"] = {**cfg["budget"], "k": 4}
    (b / "config.json").write_text(json.dumps(cfg))
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("A man is playing a guitar.", "Two dogs run on the beach.",
                                                                       "The central bank raised interest rates.")))
    common = [str(a), str(b), str(texts)]
    monkeypatch.setattr("sys.argv", ["hand_models.py", "draw", *common, "--each", "6", "--out", str(tmp_path / "pairs.jsonl")])
    hm.main()
    drawn = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert len(drawn) == len({(d["text"], d["question"]) for d in drawn}) and all(set(d) == {"text", "question"} for d in drawn)
    ts = hm.read_texts(str(texts))
    rng = np.random.default_rng(93)
    picks_a = hm.sample(hm.shown(str(a), ts), 6, rng)
    picks_b = hm.sample(hm.shown(str(b), ts), 6, rng)
    assert {(d["text"], d["question"]) for d in drawn} == {(ts[r], q) for r, q in picks_a + picks_b}
    answered = [{**d, "answer": any((ts[r], q) == (d["text"], d["question"]) for r, q in picks_a)} for d in drawn]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(h) + "\n" for h in answered))
    monkeypatch.setattr("sys.argv", ["hand_models.py", "score", *common, str(tmp_path / "pairs.jsonl"), "--each", "6",
                                     "--json", str(tmp_path / "out.json")])
    hm.main()
    out = json.loads((tmp_path / "out.json").read_text())
    share_b = sum(p in picks_a for p in picks_b) / len(picks_b)
    assert out["A"]["yes_precision"] == 1.0 and out["B"]["yes_precision"] == pytest.approx(share_b, abs=1e-4)
    assert out["precision_change"] == pytest.approx(share_b - 1.0, abs=1e-4)
    assert capsys.readouterr().out.splitlines()[-1] == f"hand_models_precision_change: {share_b - 1.0:.4f}"
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in drawn))  # the draw, not yet answered
    monkeypatch.setattr("sys.argv", ["hand_models.py", "score", *common, str(tmp_path / "pairs.jsonl"), "--each", "6"])
    with pytest.raises(SystemExit, match="none of A's drawn pairs is answered: score the file `draw` wrote, with the same models, texts, --each and --seed"):
        hm.main()
