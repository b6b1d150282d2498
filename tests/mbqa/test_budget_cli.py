"""`cqg-ray budget MODEL` and `cqg-ray evaluate --budget`: set a model's budget and measure its means on texts."""

import json
from pathlib import Path

import numpy as np
import pytest

from cqg_ray.cli import main
from cqg_ray.mbqa.budget import Budget
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from tests.mbqa.test_embedder import encoder, make_model  # noqa: F401  (the module's encoder fixture)

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus_400.jsonl"


def test_budget_sets_the_rule_measures_the_means_and_refuses_centred_values_without_them(encoder, tmp_path, capsys):  # noqa: F811
    path = str(tmp_path / "model")
    make_model(encoder).save(path)
    assert main(["budget", path]) == 0 and "budget: tau=0.5" in capsys.readouterr().out  # shown, nothing written
    assert json.loads((tmp_path / "model" / "config.json").read_text())["format_version"] == 1

    assert main(["budget", path, "--rule", "top_k", "--k", "3", "--floor", "none", "--value", "prob"]) == 0
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    assert cfg["format_version"] == 2 and cfg["budget"] == {"rule": "top_k", "k": 3, "floor": None, "value": "prob", "rank": "prob"}
    assert "stats" not in cfg

    assert main(["budget", path, "--value", "centred"]) == 2
    assert "give --stats" in capsys.readouterr().err
    assert json.loads((tmp_path / "model" / "config.json").read_text())["budget"]["value"] == "prob"  # untouched
    assert main(["budget", path, "--k", "0"]) == 2 and "k must be an integer" in capsys.readouterr().err

    assert main(["budget", path, "--stats", str(CORPUS), "--n", "50", "--value", "centred", "--rank", "centred"]) == 0
    model = InterpretableEmbedder.load(path, encoder=encoder)
    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()]
    from cqg_ray.textfiles import sample_indices

    want = model.encode([texts[i] for i in sample_indices(len(texts), 50, 0)], output="probs").mean(axis=0)
    np.testing.assert_allclose(model.mean, want, rtol=1e-4, atol=1e-6)
    assert model.budget == Budget(rule="top_k", k=3, floor=None, value="centred", rank="centred")
    assert model.stats_source.startswith("50 texts of ") and "corpus_400.jsonl" in model.stats_source

    assert main(["budget", path, "--rank", "lift", "--lift", "0.75", "--floor", "0.5", "--value", "prob"]) == 0
    assert json.loads((tmp_path / "model" / "config.json").read_text())["budget"] == {
        "rule": "top_k", "k": 3, "floor": 0.5, "value": "prob", "rank": "lift", "lift": 0.75}
    assert InterpretableEmbedder.load(path, encoder=encoder).budget == Budget(rule="top_k", k=3, floor=0.5, value="prob", rank="lift", lift=0.75)
    assert main(["budget", path, "--lift", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: budget lift must lie in (0, 1], got 2.0"  # not "budget: budget lift"
    before = (tmp_path / "model" / "config.json").read_bytes()
    for args, says in ((["--tau", "2"], "budget tau would not be used"), (["--rule", "tau", "--k", "5"], "budget k would not be used"),
                       (["--rank", "prob", "--lift", "0.3"], "budget lift would not be used"),
                       (["--k", "500"], f"k must be at most the model's m={model.m}, got 500")):
        assert main(["budget", path, *args]) == 2, args
        assert says in capsys.readouterr().err, args
        assert (tmp_path / "model" / "config.json").read_bytes() == before, args  # nothing written
    assert main(["budget", path, "--rule", "tau"]) == 0  # the model's own tau
    assert InterpretableEmbedder.load(path, encoder=encoder).budget == Budget(rule="tau", tau=model.tau, value="prob")


def test_budget_stats_that_cannot_be_measured_are_refused_and_the_folder_is_kept(encoder, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "model"
    make_model(encoder).save(str(path))
    assert main(["budget", str(path), "--stats", str(CORPUS), "--n", "50"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    for args, says in [(["--stats", str(CORPUS), "--n", "0"], "--n must be at least 1"),
                       (["--stats", str(CORPUS), "--n", "-3"], "--n must be at least 1"),
                       (["--stats", str(CORPUS), "--seed", "-1"], "error: --seed must be in [0, 2147483647], got -1"),  # a traceback
                       (["--stats", str(tmp_path / "empty.jsonl")], "budget --stats: "),
                       (["--stats", str(tmp_path / "latin1.jsonl")], "budget --stats: "),
                       (["--stats", str(tmp_path / "missing.jsonl")], "budget --stats: ")]:
        assert main(["budget", str(path), *args]) == 2, args
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("error: ") and says in last, (args, last)
        assert {p.name: p.read_bytes() for p in path.iterdir()} == before, args


def test_evaluate_budget_option_parses_over_the_models_own():
    from cqg_ray.config import ConfigError
    from cqg_ray.evaluate.cli import parse_budget

    base = Budget(rule="top_k", k=112, floor=0.5, value="centred", rank="centred")
    assert parse_budget(["k=16", "floor=none"], base) == Budget(rule="top_k", k=16, floor=None, value="centred", rank="centred")
    assert parse_budget(["rule=tau", "tau=0.7", "value=one"], base) == Budget(rule="tau", tau=0.7)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_budget(["k16"], base)
    with pytest.raises(ConfigError, match="rank"):
        parse_budget(["rank=mean"], base)
    with pytest.raises(ConfigError, match="budget tau would not be used"):
        parse_budget(["tau=5"], base)
    assert parse_budget(["rank=lift", "lift=0.25", "k=12"], base) == Budget(rule="top_k", k=12, floor=0.5, value="centred", rank="lift", lift=0.25)


def test_budget_keeps_the_config_keys_it_does_not_write_and_the_versions_that_made_the_model(encoder, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "model"
    make_model(encoder).save(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(versions={"cqg_ray": "0.0.1-trained-here"}, note="a user's key")
    (path / "config.json").write_text(json.dumps(cfg))
    heads = (path / "heads.safetensors").read_bytes()
    assert main(["budget", str(path), "--rule", "top_k", "--k", "2"]) == 0
    after = json.loads((path / "config.json").read_text())
    assert after["note"] == "a user's key" and after["versions"] == {"cqg_ray": "0.0.1-trained-here"}
    assert after["budget"]["k"] == 2 and after["format_version"] == 2
    assert (path / "heads.safetensors").read_bytes() == heads


def test_a_shipped_model_named_by_its_name_is_shown_but_not_rewritten(encoder, tmp_path, capsys, monkeypatch):  # noqa: F811
    """`cqg-ray budget NAME --k 20` would change every later load by that name: refused, the folder untouched; by its
    path the same folder is changed, as any folder is."""
    shipped = tmp_path / "shipped"
    make_model(encoder).save(str(shipped / "my-model"))
    monkeypatch.setenv("CQG_RAY_MODELS", str(shipped))
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_bytes() for p in (shipped / "my-model").iterdir()}
    assert main(["budget", "my-model"]) == 0 and "budget: tau=0.5" in capsys.readouterr().out
    assert main(["budget", "my-model", "--rule", "top_k", "--k", "3"]) == 2
    err = capsys.readouterr().err
    assert f"budget: my-model is a shipped model ({shipped / 'my-model'}): copy its folder" in err
    assert {p.name: p.read_bytes() for p in (shipped / "my-model").iterdir()} == before
    assert main(["budget", str(shipped / "my-model"), "--rule", "top_k", "--k", "3"]) == 0
    assert json.loads((shipped / "my-model" / "config.json").read_text())["budget"]["k"] == 3
