"""Work-unit pools on a real 2-node Ray (ray.cluster_utils.Cluster), in a subprocess so it owns its Ray."""

import json
import os
import subprocess
import sys
import textwrap

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
