"""Real multi-node runs on one machine (ray.cluster_utils.Cluster), in a subprocess so they own their Ray."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import ray
    from ray.cluster_utils import Cluster
    from cqg_ray.config import CorpusConfig, EncodeConfig
    from cqg_ray.artifacts import load_corpus, load_embeddings
    from cqg_ray.corpus import prepare
    from cqg_ray.encode import encode
    from cqg_ray.rundir import RunDir, run_stage

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    run = RunDir(sys.argv[2])
    c = CorpusConfig(paths=[sys.argv[1]], limit=200, rows_per_shard=100)
    run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    e = EncodeConfig(batch_size=32, num_actors=2, unit_rows=25)
    m = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, progress=False))
    ids, x = load_embeddings(run)
    corpus_ids = load_corpus(run, ["doc_id"]).column("doc_id").to_pylist()
    print("RESULT", json.dumps({"counts": m["counts"], "n": len(ids), "unique": len(set(ids.tolist())), "same_ids": ids.tolist() == corpus_ids}))
    ray.shutdown()
    cluster.shutdown()
''')


@pytest.mark.slow
def test_encode_on_two_nodes(tmp_path, corpus_file):
    script = tmp_path / "two_nodes.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script), str(corpus_file), str(tmp_path / "run")], env=env,
                         capture_output=True, text=True, timeout=600)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(line[0][7:])
    assert res["n"] == 200 and res["unique"] == 200 and res["same_ids"]
    assert res["counts"]["documents"] == 200
    assert res["counts"]["nodes_used"] == 2
