"""bench/scale.py, its pure parts (no Ray): the static-embedding encoder, the synthetic corpus, the config, the last lines."""

import json
from pathlib import Path

import numpy as np
import pytest

from cqg_ray.config import config_from_dict
from tests.scripts import load_script

scale = load_script("bench/scale.py", "bench_scale")


def test_static_encoder_builds_and_encodes_through_the_encoder_interface(tmp_path):
    from cqg_ray.encoder import load_encoder

    folder = scale.static_encoder(str(tmp_path / "static"))
    assert (Path(folder) / "modules.json").exists()
    assert scale.static_encoder(folder) == folder  # built once: the second call finds it
    enc = load_encoder(folder, backend="torch-float32", device="cpu")
    assert enc.dim == 384
    e = enc.encode(["A man is playing a guitar.", "Someone plays music on stage.", "The stock market fell today."])
    assert e.shape == (3, 384) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]  # word vectors still carry some meaning


def test_corpus_writer_writes_n_unique_texts(tmp_path):
    sentences = ["one sentence.", "another one.", "one sentence."]  # a repeated sentence stays unique with its counter
    paths = scale.write_corpus(str(tmp_path / "in"), 25, sentences, rows_per_file=10)
    assert [Path(p).name for p in paths] == ["texts-0000.jsonl", "texts-0001.jsonl", "texts-0002.jsonl"]
    rows = [json.loads(line) for p in paths for line in open(p)]
    texts = [r["text"] for r in rows]
    assert len(texts) == 25 and len(set(texts)) == 25
    assert all(any(t.startswith(s) for s in sentences) for t in texts)
    assert scale.write_corpus(str(tmp_path / "again"), 25, sentences, rows_per_file=10) and \
        [json.loads(line)["text"] for p in sorted((tmp_path / "again").iterdir()) for line in open(p)] == texts  # seeded
    with pytest.raises(ValueError):
        scale.write_corpus(str(tmp_path / "none"), 3, [])


def test_config_has_the_shapes(tmp_path):
    cfg = config_from_dict(scale.scale_config(100_000, str(tmp_path / "run"), [str(tmp_path / "a.jsonl")], str(tmp_path / "enc")))
    assert cfg.cluster.k == 100 and cfg.llm.backend == "fake" and cfg.cqg.max_opening_share == 1.0
    per_question = cfg.label.n_cluster + cfg.label.n_neighbor + cfg.label.n_random
    questions = cfg.cluster.k * min(cfg.cqg.t, cfg.cqg.prompts_per_cluster)  # the fake's parser keeps one question a prompt
    assert questions * per_question >= 100_000  # at least N label pairs
    assert cfg.encode.model == str(tmp_path / "enc") and cfg.encode.backend == "torch-float32"
    assert cfg.train.num_workers == 1 and [scale.train_workers(n) for n in (300_000, 1_000_000)] == [2, 4]


def test_stage_of_a_run_directory(tmp_path):
    assert scale.current_stage(str(tmp_path)) == "startup"
    (tmp_path / "prepare").mkdir()
    assert scale.current_stage(str(tmp_path)) == "prepare"
    (tmp_path / "prepare" / "_manifest.json").write_text("{}")
    assert scale.current_stage(str(tmp_path)) == "encode"
    for s in scale.STAGES:
        (tmp_path / s).mkdir(exist_ok=True)
        (tmp_path / s / "_manifest.json").write_text("{}")
    assert scale.current_stage(str(tmp_path)) == "done"
    assert scale.count_files(str(tmp_path / "prepare")) == 1 and scale.count_files(str(tmp_path / "nothing")) == 0


def test_growth_and_the_last_lines():
    def size(driver, workers):
        return {"driver_rss_mb": driver, "stages": {s: {"worker_rss_mb": w} for s, w in workers.items()}}

    results = {100_000: size(400.0, {"encode": 800.0, "labels": 300.0}), 300_000: size(420.0, {"encode": 820.0, "labels": 600.0}),
               1_000_000: size(500.0, {"encode": 850.0, "labels": 900.0})}
    w, d, stage = scale.growth(results)
    assert stage == "labels" and w == pytest.approx(3.0) and d == pytest.approx(1.25)
    assert scale.growth_lines(w, d) == ["worker_rss_growth_1M_over_100k: 3.000", "driver_rss_growth_1M_over_100k: 1.250"]
    assert scale.task_name("ray::MapWorker(MapBatches(EncodeUnits)).submit") == "MapBatches(EncodeUnits)"
    assert scale.task_name("ray::MapWorker(MapBatches(EncodeUnits)).__init__") == "MapBatches(EncodeUnits)"
    assert scale.task_name("ray::keywords_of") == "keywords_of"
    assert scale.size_name(1_000_000) == "1M" and scale.size_name(300_000) == "300k" and scale.fmt_bytes(1.5e9) == "1.5 GB"
