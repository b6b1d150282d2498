"""Encoding: unit planning (pure), the Ray Data stage with the real bundled encoder, resume, then clustering."""

import numpy as np
import pytest

from cqg_ray.artifacts import Clusters, load_corpus, load_embeddings
from cqg_ray.cluster import cluster
from cqg_ray.config import ClusterConfig, CorpusConfig, EncodeConfig
from cqg_ray.corpus import prepare
from cqg_ray.encode import encode
from cqg_ray.encoder import load_encoder
from cqg_ray.pools import declared
from cqg_ray.units import actor_pool_size, actor_threads, pool_threads, split_units
from cqg_ray.rundir import RunDir, run_stage

NAME = "bundled:all-MiniLM-L6-v2"
LIMIT_COUNTS = ("texts_counted", "texts_at_token_limit", "token_limit", "texts_not_counted")


def test_split_units():
    units = split_units([("/c/part-a.parquet", 25), ("/c/part-b.parquet", 10)], unit_rows=10)
    assert [(u["start"], u["stop"]) for u in units] == [(0, 10), (10, 20), (20, 25), (0, 10)]
    assert units[1]["name"] == "emb-part-a-000000010.parquet"
    assert len({u["name"] for u in units}) == 4


def test_actor_pool_size():
    # ((min, max) actors, GPUs per actor); a fixed cluster (nothing declared) keeps a fixed pool of the same size
    assert actor_pool_size(EncodeConfig(), {"CPU": 2}) == ((2, 2), 0.0)
    assert actor_pool_size(EncodeConfig(), {"CPU": 16, "GPU": 4}) == ((4, 4), 1.0)
    assert actor_pool_size(EncodeConfig(num_actors=3, num_gpus_per_actor=0.5), {"GPU": 4}) == ((3, 3), 0.5)
    assert actor_pool_size(EncodeConfig(), {"CPU": 16}, units=3) == ((3, 3), 0.0)  # never more actors than units
    assert actor_pool_size(EncodeConfig(), {"CPU": 16}, units=0) == ((1, 1), 0.0)


def test_actor_threads_share_the_cpus_a_pool_cut_by_its_units_leaves():
    assert actor_threads(1, [2.0], 1) == 2  # the demo: one unit on two cores
    assert actor_threads(1, [2.0], 2) == 1
    assert actor_threads(1, [16.0], 3) == 5
    assert actor_threads(1, [8.0, 8.0], 3) == 4  # three actors of 5 would not fit two nodes of 8
    assert actor_threads(1, [8.0, 8.0], 2) == 8
    assert actor_threads(2, [4.0], 4) == 2  # at least the config's threads, even where the pool does not fit now
    assert actor_threads(1, [], 1) == 1
    # the config's threads, asking no cluster: GPU actors, actors beside a tokenizing stage, no units left
    assert [pool_threads(1, (1, 1), 1.0, None, 1), pool_threads(1, (1, 1), 0.0, {"actors": 1}, 1), pool_threads(3, (1, 1), 0.0, None, 0)] == [1, 1, 3]


def test_actor_pool_grows_to_the_declared_resources():
    now = {"CPU": 4}
    assert actor_pool_size(EncodeConfig(), now, declared(now, max_cpus=64)) == ((4, 64), 0.0)
    assert actor_pool_size(EncodeConfig(torch_threads=2), now, declared(now, max_cpus=64)) == ((2, 32), 0.0)
    # a cluster that starts without GPUs but may get 8: GPU actors, one at first (pending until a GPU node comes)
    assert actor_pool_size(EncodeConfig(), now, declared(now, max_gpus=8)) == ((1, 8), 1.0)
    assert actor_pool_size(EncodeConfig(), now, declared(now, max_gpus=8), units=5) == ((1, 5), 1.0)
    assert actor_pool_size(EncodeConfig(num_actors=3), now, declared(now, max_cpus=64)) == ((3, 3), 0.0)  # a count fixes both


def test_encode_resume_and_cluster(ray_local, tmp_path, corpus_file, monkeypatch):
    from cqg_ray.progress import read_progress

    run = RunDir(str(tmp_path / "run"))
    c = CorpusConfig(paths=[str(corpus_file)], limit=240, rows_per_shard=100)
    run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    e = EncodeConfig(batch_size=32)
    monkeypatch.setenv("CQG_RAY_PROGRESS", "1")  # the actors relay their texts to the driver's view (no bar: progress=False)
    m = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, unit_rows=50, progress=False))
    monkeypatch.setenv("CQG_RAY_PROGRESS", "0")
    assert m["counts"]["documents"] == 240
    p = read_progress(run)
    assert (p["stage"], p["done"], p["total"], p["final"]) == ("encode", 240, 240, True)  # counted in the actors
    assert m["counts"]["dim"] == 384
    # the texts the encoder read only in part, counted per unit file: none of these short texts fills 256 tokens
    assert {k: m["counts"][k] for k in LIMIT_COUNTS} == {"texts_counted": 240, "texts_at_token_limit": 0, "token_limit": 256, "texts_not_counted": 0}
    ids, x = load_embeddings(run)
    assert ids.tolist() == load_corpus(run, ["doc_id"]).column("doc_id").to_pylist()
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)

    # resume: lose one unit file and the manifest (as a kill would), rerun: only that unit is encoded again
    files = run.ls("encode", suffix=".parquet")
    lost = run.read_table(f"encode/{files[1]}").num_rows  # 3 shards of 80 (equal splits of 240): units of 50 and 30
    assert sorted({run.read_table(f"encode/{f}").num_rows for f in files}) == [30, 50]
    run.rm("encode", files[1])
    run.invalidate("encode")
    m2 = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, unit_rows=50, progress=False))
    assert m2["counts"]["encoded_now"] == lost
    # six units on two CPUs: a thread an actor; the one unit left: one actor with both CPUs (actor_threads)
    assert (m["counts"]["threads_per_actor"], m2["counts"]["threads_per_actor"]) == (1, 2)
    assert m2["counts"]["units_resumed"] == len(files) - 1
    assert (m2["counts"]["texts_counted"], m2["counts"]["texts_at_token_limit"]) == (240, 0)  # the resumed units' counts too
    ids2, x2 = load_embeddings(run)
    assert ids2.tolist() == ids.tolist()
    assert np.allclose(x, x2, atol=1e-5)

    # a subset by id
    sub_ids, sub = load_embeddings(run, ids[[5, 1]])
    assert sub_ids.tolist() == sorted(ids[[5, 1]].tolist())

    cc = ClusterConfig(k=6, n_neighbors=5)
    m3 = run_stage(run, "cluster", cc.config_hash(), lambda ctx: cluster(cc, ctx))
    assert m3["counts"]["clusters"] + m3["counts"]["empty_removed"] == 6
    cl = Clusters.load(run)
    assert cl.doc_ids.tolist() == ids.tolist()
    assert cl.neighbors.shape == (cl.k, 5)
    assert int(cl.sizes.sum()) == 240
    assert np.bincount(cl.labels).tolist() == cl.sizes.tolist()

    # another max_seq_length: every unit is encoded again, none of the other setting's is resumed (they were, as done)
    e16 = EncodeConfig(batch_size=32, max_seq_length=16)
    m4 = run_stage(run, "encode", e16.config_hash(), lambda ctx: encode(e16, ctx, unit_rows=50, progress=False))
    assert (m4["counts"]["units_resumed"], m4["counts"]["encoded_now"]) == (0, 240)
    assert run.read_json("encode/_units.json") == {"model": "bundled:all-MiniLM-L6-v2", "dtype": "float32", "max_seq_length": 16}
    assert not np.allclose(load_embeddings(run)[1], x, atol=1e-3)
    texts = load_corpus(run, ["text"]).column("text").to_pylist()  # their lengths in tokens, untruncated, by the model's own tokenizer
    lengths = [len(t) for t in load_encoder(NAME, backend="torch-float32", device="cpu").st.tokenizer(texts)["input_ids"]]
    assert 0 < sum(n >= 16 for n in lengths) < 240
    assert (m4["counts"]["texts_counted"], m4["counts"]["texts_at_token_limit"], m4["counts"]["token_limit"]) == (240, sum(n >= 16 for n in lengths), 16)

    # a unit file damaged behind the manifest: --force (the fix `cqg-ray status` names) encodes that unit again
    files = run.ls("encode", suffix=".parquet")
    damaged = run.read_table(f"encode/{files[2]}").num_rows
    (tmp_path / "run" / "encode" / files[2]).write_bytes(run.read_bytes(f"encode/{files[2]}")[:1000])
    m5 = run_stage(run, "encode", e16.config_hash(), lambda ctx: encode(e16, ctx, unit_rows=50, progress=False), force=True)
    assert (m5["counts"]["units_resumed"], m5["counts"]["encoded_now"]) == (len(files) - 1, damaged)
    assert run.read_table(f"encode/{files[2]}").num_rows == damaged


def test_the_tokenizing_stage_writes_the_same_files_and_resumes(ray_local, tmp_path, corpus_file):
    """tokenize_stage=on (a CPU actor reads and tokenizes each unit, the encoder actor runs the model): the same unit
    files, bit for bit, as the actors tokenizing themselves; a lost unit is the only one done again."""
    import shutil

    c = CorpusConfig(paths=[str(corpus_file)], limit=240, rows_per_shard=100)
    runs, manifests = {}, {}
    run_stage(RunDir(str(tmp_path / "off")), "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    shutil.copytree(tmp_path / "off" / "prepare", tmp_path / "on" / "prepare")  # the same shards (their names hold a uuid)
    for mode in ("off", "on"):
        run = runs[mode] = RunDir(str(tmp_path / mode))
        e = EncodeConfig(batch_size=16, tokenize_stage=mode, max_seq_length=16)  # a limit some texts fill
        manifests[mode] = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, unit_rows=50, progress=False))
    assert [manifests[m]["counts"]["tokenize_stage"] for m in ("off", "on")] == [False, True]
    assert manifests["on"]["counts"]["documents"] == 240 and manifests["on"]["counts"]["unit_bytes_read"] > 0
    for mode in ("off", "on"):  # the actors' time inside units is part of the pass's wall time, for each of at most 2 actors (2 CPUs)
        c = manifests[mode]["counts"]
        assert 0 < c["unit_seconds"] <= c["wall_s"] * 2
    on, off = ({k: manifests[m]["counts"][k] for k in LIMIT_COUNTS} for m in ("on", "off"))  # counted where the model runs
    assert on == off and off["texts_counted"] == 240 and 0 < off["texts_at_token_limit"] < 240 and off["token_limit"] == 16
    files = runs["off"].ls("encode", suffix=".parquet")
    assert runs["on"].ls("encode", suffix=".parquet") == files and len(files) == 6

    def same():
        for f in files:
            a, b = (runs[m].read_table(f"encode/{f}") for m in ("off", "on"))
            assert a.column("doc_id").to_pylist() == b.column("doc_id").to_pylist()
            np.testing.assert_array_equal(np.stack(a.column("embedding").to_numpy(zero_copy_only=False)),
                                          np.stack(b.column("embedding").to_numpy(zero_copy_only=False)))

    same()
    run, e = runs["on"], EncodeConfig(batch_size=16, tokenize_stage="on", max_seq_length=16)
    run.rm("encode", files[2])
    run.invalidate("encode")
    m = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, unit_rows=50, progress=False))
    assert (m["counts"]["encoded_now"], m["counts"]["units_resumed"]) == (runs["off"].read_table(f"encode/{files[2]}").num_rows, 5)
    same()


def test_an_unknown_bundled_encoder_is_a_config_error_before_any_actor(tmp_path):
    from cqg_ray.config import ConfigError

    e = EncodeConfig(model="bundled:nope")
    with pytest.raises(ConfigError) as err:
        run_stage(RunDir(str(tmp_path / "run")), "encode", e.config_hash(), lambda ctx: encode(e, ctx), deps=[])
    assert str(err.value) == "encode.model: unknown bundled encoder 'bundled:nope'; known: bundled:all-MiniLM-L6-v2"
