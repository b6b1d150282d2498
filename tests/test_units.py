"""Work units: a tokenized unit as it travels from the CPU stage, the actors' plans (pure); pools on a real 2-node Ray
(ray.cluster_utils.Cluster), in a subprocess so it owns its Ray."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent('''
    import json, sys, threading, time
    import pyarrow as pa, pyarrow.parquet as pq
    import ray
    from ray.cluster_utils import Cluster
    from cqg_ray.config import EncodeConfig
    from cqg_ray.pools import declared
    from cqg_ray.rundir import RunDir
    from cqg_ray.units import UnitActor, actor_pool_size, run_units, split_units

    class SleepUnits(UnitActor):
        def __init__(self, run_uri):
            self.run = RunDir(run_uri)

        def write_unit(self, name, doc_ids, texts):
            time.sleep(0.75)

    shard = sys.argv[1] + "/shard.parquet"
    pq.write_table(pa.table({"doc_id": [str(i) for i in range(80)], "text": ["t"] * 80}), shard)
    units = split_units([(shard, 80)], 2)  # 40 units of 0.75 s: ~27 s of work left when the node joins, time for an actor to start there on a busy machine
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    now = ray.cluster_resources()
    pool, gpus = actor_pool_size(EncodeConfig(), now, declared(now, max_cpus=2), units=len(units))
    fixed = actor_pool_size(EncodeConfig(), now, units=len(units))[0]
    out = {}
    work = threading.Thread(target=lambda: out.update(zip(("rows", "nodes"), run_units(units, SleepUnits, {"run_uri": sys.argv[1]},
                                                                                           pool, gpus, 1, "units", False))))
    work.start()
    time.sleep(3)  # the pool runs on the head's one CPU, then a second node joins
    cluster.add_node(num_cpus=1)
    work.join(timeout=120)
    print("RESULT", json.dumps({"pool": pool, "fixed": fixed, "rows": out.get("rows"), "nodes": len(out.get("nodes", ())),
                                "alive": len([n for n in ray.nodes() if n["Alive"]])}))
    ray.shutdown()
    cluster.shutdown()
''')


@pytest.mark.ray
def test_a_pool_sized_from_declared_cpus_reaches_a_node_that_joins_later(tmp_path):
    """Proves: on a 1-CPU head with ray.max_cpus declared as 2, `actor_pool_size` gives the pool (1, 2) (nothing
    declared: (1, 1)), and `run_units`' Ray Data pool, started before a second 1-CPU node exists, puts an actor on
    that node once it joins (the units were done on 2 nodes; the same script with the (1, 1) pool did them on 1 node,
    checked by hand). It proves nothing about GPUs or a real autoscaler: the node is added by hand."""
    script = tmp_path / "grow.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[0][7:])
    assert res["pool"] == [1, 2] and res["fixed"] == [1, 1]
    assert res["rows"] == 80 and res["alive"] == 2
    assert res["nodes"] == 2


def test_a_tokenized_unit_travels_as_bytes_without_pickle():
    from cqg_ray.units import pack_tokens, unpack_tokens

    ids = ["doc-1", "Ünï-2", "3"]
    chunks = [(np.array([0, 2]), [(np.array([1]), {"input_ids": np.array([[101, 7, 102]]), "attention_mask": np.array([[1, 1, 1]])}),
                                  (np.array([0]), {"input_ids": np.array([[101, 102, 0]]), "attention_mask": np.array([[1, 1, 0]])})]),
              (np.array([1]), [(np.array([0]), {"input_ids": np.array([[101, 5, 6, 102]]), "attention_mask": np.array([[1, 1, 1, 1]])})])]
    blob = pack_tokens(ids, chunks, "abc123")
    assert isinstance(blob, bytes) and b"pickle" not in blob
    got_ids, got, digest = unpack_tokens(blob)
    assert got_ids == ids and digest == "abc123" and len(got) == 2
    for (rows, batches), (rows2, batches2) in zip(chunks, got):
        assert rows2.tolist() == rows.tolist() and len(batches2) == len(batches)
        for (idx, inputs), (idx2, inputs2) in zip(batches, batches2):
            assert idx2.tolist() == idx.tolist() and sorted(inputs2) == sorted(inputs)
            assert all(inputs2[k].dtype == np.int64 and inputs2[k].tolist() == inputs[k].tolist() for k in inputs)
    assert unpack_tokens(pack_tokens([], [], "d")) == ([], [], "d")


def test_the_actors_plans_cover_each_row_once_in_the_order_encode_batches():
    from cqg_ray.encode import PROGRESS_TEXTS, EncodeUnits
    from cqg_ray.encoder import batch_plan, length_order
    from cqg_ray.mbqa.embedder import chunk_plan

    texts = [f"t{i} " * (i % 13) for i in range(2 * PROGRESS_TEXTS + 7)]
    for plan in (EncodeUnits.plan(texts, 32, True), chunk_plan(texts, 32, False, chunk_size=1000)):
        rows = np.concatenate([r for r, _ in plan])
        assert sorted(rows.tolist()) == list(range(len(texts)))
        for r, batches in plan:
            assert sorted(np.concatenate(batches).tolist()) == list(range(len(r))) and max(len(b) for b in batches) == min(32, len(r))
    plan = EncodeUnits.plan(texts, 32, True)
    assert [len(r) for r, _ in plan] == [PROGRESS_TEXTS, PROGRESS_TEXTS, 7] and plan[1][0][0] == PROGRESS_TEXTS  # unit order
    assert all(np.array_equal(a, b) for a, b in zip(plan[2][1], batch_plan(texts[-7:], 32, True)))
    plan = chunk_plan(texts, 32, False, chunk_size=1000)
    assert np.array_equal(np.concatenate([r for r, _ in plan]), length_order(texts))  # encode's chunks: length order
    assert EncodeUnits.plan([], 32, True) == [] and chunk_plan([], 32, True) == []


def test_cpu_actors_make_room_for_the_tokenizing_stage():
    from cqg_ray.units import room_for_tokenizing

    assert room_for_tokenizing((2, 2), None, 0.0, 1) == (2, 2)
    assert room_for_tokenizing((2, 2), {"actors": 1}, 0.0, 1) == (1, 1)  # 2 CPUs: one encoder actor beside one tokenizer
    assert room_for_tokenizing((4, 16), {"actors": 3}, 0.0, 2) == (2, 14)  # 2 threads an actor: two actors give up 4 CPUs
    assert room_for_tokenizing((1, 1), {"actors": 4}, 0.0, 1) == (1, 1)  # never below one actor
    assert room_for_tokenizing((4, 8), {"actors": 16}, 1.0, 1) == (4, 8)  # GPU actors take no CPU of the stage's
