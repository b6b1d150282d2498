"""The packaged configs, found by name; paths keep their meaning."""

import re
from pathlib import Path

import pytest

from cqg_ray.config import ConfigError, load_config
from cqg_ray.configs import config_file, packaged

CONFIGS = Path(__file__).resolve().parents[1] / "cqg_ray" / "configs"


def test_packaged_configs_by_name():
    assert packaged() == {f.stem: f for f in CONFIGS.glob("*.yaml")}
    assert {"demo", "paper", "reference", "serve"} <= set(packaged())  # the names the CLI, the docs and the jobs use
    assert config_file("demo") == CONFIGS / "demo.yaml"
    assert config_file("paper.yaml") == CONFIGS / "paper.yaml"
    assert load_config("reference") == load_config(CONFIGS / "reference.yaml")


def test_a_path_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").write_text("cluster: {k: 7}\n")
    assert config_file("demo") == Path("demo") and load_config("demo").cluster.k == 7
    assert config_file("sub/demo.yaml") == Path("sub/demo.yaml")  # a path with a folder is never a packaged name
    assert config_file(tmp_path / "x.yaml") == tmp_path / "x.yaml"


def test_unknown_name_lists_the_packaged_configs():
    names = ", ".join(sorted(packaged()))
    with pytest.raises(ConfigError, match=re.escape(f"config file not found: nope (packaged configs: {names})")):
        load_config("nope")


def test_a_config_that_is_not_utf8_text_or_is_a_folder_is_named(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes(b"corpus: {paths: [caf\xe9.jsonl]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "latin1.yaml")
    assert str(e.value) == f"{tmp_path / 'latin1.yaml'} is not UTF-8 text (byte 20): save the config as UTF-8"
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path)
    assert str(e.value) == f"{tmp_path} is a folder, not a config file"
