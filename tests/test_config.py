import pytest

from cqg_ray.config import ConfigError, PipelineConfig, check_corpus_size, config_from_dict, load_config, stage_hash


def test_paper_defaults():
    cfg = PipelineConfig()
    assert cfg.cluster.k == 5000
    assert (cfg.cqg.n_p, cfg.cqg.n_h, cfg.cqg.n_e) == (6, 18, 18)
    assert (cfg.cqg.p_p, cfg.cqg.p_h, cfg.cqg.p_e) == (5, 3, 2)
    assert cfg.cqg.theta_value == 0.8
    assert cfg.cqg.t == 4
    assert cfg.cqg.hard_neighbors == 3
    assert cfg.train.lr == 1e-4
    assert cfg.train.tau == 0.5
    assert cfg.train.hidden == 8
    assert (cfg.label.n_cluster, cfg.label.n_neighbor, cfg.label.n_random) == (500, 300, 200)
    assert cfg.label.neighbor_clusters == 5
    assert cfg.label.questions_per_prompt == 20
    assert cfg.train.holdout == 0.1


def test_qaemb_theta_default():
    cfg = config_from_dict({"cqg": {"method": "qaemb"}})
    assert cfg.cqg.theta_value == 0.925
    assert config_from_dict({"cqg": {"method": "qaemb", "theta": 0.9}}).cqg.theta_value == 0.9


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run_dir: /tmp/x\ncluster:\n  k: 40\n")
    cfg = load_config(p, ["cqg.t=2", "corpus.paths=[a.jsonl, b.jsonl]"])
    assert cfg.run_dir == "/tmp/x"
    assert cfg.cluster.k == 40
    assert cfg.cqg.t == 2
    assert cfg.corpus.paths == ["a.jsonl", "b.jsonl"]


def test_unknown_key_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("cluster:\n  kk: 40\n")
    with pytest.raises(ConfigError, match=r"cluster\.kk: unknown key"):
        load_config(p)


def test_unknown_section():
    with pytest.raises(ConfigError, match=r"clusterr: unknown key"):
        config_from_dict({"clusterr": {}})


def test_wrong_type():
    with pytest.raises(ConfigError, match=r"cqg\.n_p"):
        config_from_dict({"cqg": {"n_p": "six"}})


def test_impossible_values():
    with pytest.raises(ConfigError, match=r"cqg\.theta"):
        config_from_dict({"cqg": {"theta": 1.5}})
    with pytest.raises(ConfigError, match="cluster.k=50 is larger than corpus.limit=10"):
        config_from_dict({"cluster": {"k": 50}, "corpus": {"limit": 10}})
    with pytest.raises(ConfigError, match="n_neighbors"):
        config_from_dict({"cluster": {"n_neighbors": 2}})


def test_corpus_size_checks():
    cfg = config_from_dict({"cluster": {"k": 10}})
    check_corpus_size(cfg, 100)
    with pytest.raises(ConfigError, match=r"cqg.n_h=18 > 12 documents"):
        check_corpus_size(cfg, 12)


def test_missing_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("cluster: [k: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_stage_hash_changes_only_with_its_sections():
    a = PipelineConfig()
    b = config_from_dict({"cqg": {"t": 3}})
    assert stage_hash(a, "cluster") == stage_hash(b, "cluster")
    assert stage_hash(a, "questions") != stage_hash(b, "questions")
    c = config_from_dict({"llm": {"openai": {"max_concurrency": 99}}})
    assert stage_hash(a, "labels") == stage_hash(c, "labels")  # concurrency does not change answers


@pytest.mark.parametrize("name", ["demo", "reference", "paper"])
def test_packaged_configs_are_possible_on_their_corpus_sample(name):
    """Each packaged config validates and its sizes fit the corpus it samples (the paper's run: 6.8M texts)."""
    cfg = load_config(name)
    check_corpus_size(cfg, cfg.corpus.limit or 6_800_000)
    if cfg.corpus.limit:
        with pytest.raises(ConfigError, match="cluster.k"):
            check_corpus_size(cfg, cfg.cluster.k - 1)
