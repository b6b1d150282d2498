"""Ray Data encoding (our `encode` stage) vs the same encoder in one process (`load_encoder`, the `auto` backend), same texts, one run.

    python bench/encode.py [--n 60000] [--model bundled:all-MiniLM-L6-v2]   (~10 min on 2 cores)

The single-process baseline is `load_encoder(model)` (the `auto` backend, as the stage) `.encode` over all texts with
torch's default threads and the same batch size. The Ray side is the encode stage end to end (actor start-up and Parquet writes included;
`ray.init` and corpus preparation excluded) on a local Ray with every CPU. The stage's start-up (spawning
the actors, loading the model in each) is a fixed cost (~8 s with torch; ~4-5 s with an exported backend loaded from
the encoder cache), so small n understates the steady state: with torch, 0.854-0.896 at 20,000 texts and 0.998 at
60,000 (the default); with openvino, 0.975 at 60,000. Last line:
`encode_ray_vs_single: X` (Ray texts/s divided by single-process texts/s).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import DATA


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=60_000, help="texts (the Ray side pays ~8 s of actor start-up and model loading "
                    "once: at 20,000 texts on 2 cores that is ~8%% of the run, at 60,000 ~3%%)")
    ap.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    ap.add_argument("--batch-size", type=int, default=32, help="both sides (32: sentence-transformers' default and the stage's CPU default)")
    ap.add_argument("--corpus", default=DATA)
    ap.add_argument("--threads", type=int, default=None, help="torch threads per encoder actor (default: the config's, 1: one actor per CPU)")
    a = ap.parse_args()

    import ray

    from cqg_ray.config import CorpusConfig, EncodeConfig
    from cqg_ray.artifacts import load_corpus
    from cqg_ray.corpus import prepare
    from cqg_ray.encode import encode
    from cqg_ray.encoder import load_encoder
    from cqg_ray.rundir import RunDir, run_stage

    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    tmp = tempfile.mkdtemp(prefix="bench-encode-")
    run = RunDir(os.path.join(tmp, "run"))
    c = CorpusConfig(paths=[a.corpus], limit=a.n, rows_per_shard=max(1, a.n // 4))
    run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx))
    texts = load_corpus(run, ["text"]).column("text").to_pylist()

    model = load_encoder(a.model)
    model.encode(texts[:256], batch_size=a.batch_size)  # warm-up
    t0 = time.perf_counter()
    model.encode(texts, batch_size=a.batch_size)
    t_single = time.perf_counter() - t0
    model_backend = model.backend
    del model

    # many small units: the last round of a few big ones would leave actors idle (unit_rows is only the resume grain)
    e = EncodeConfig(model=a.model, batch_size=a.batch_size, unit_rows=max(200, a.n // 48),
                     **({"torch_threads": a.threads} if a.threads else {}))
    t0 = time.perf_counter()
    m = run_stage(run, "encode", e.config_hash(), lambda ctx: encode(e, ctx, progress=False))
    t_ray = time.perf_counter() - t0
    n = len(texts)
    print(f"texts: {n}  cpus: {int(ray.cluster_resources().get('CPU', 0))}  model: {a.model}")
    print(f"single process load_encoder ({model_backend}): {t_single:7.2f} s  {n / t_single:8.1f} texts/s")
    print(f"Ray Data encode stage ({m['counts']['units']} units):  {t_ray:7.2f} s  {n / t_ray:8.1f} texts/s")
    print(f"encode_ray_vs_single: {t_single / t_ray:.3f}")


if __name__ == "__main__":
    main()
