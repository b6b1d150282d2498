"""Ray Data batch embedding (`cqg-ray embed`) vs the model's own single-process `.encode`, same texts, one run.

    python bench/embed.py [--n 20000] [--model MODEL_FOLDER] [--tokenize-stage on]

Texts: the first N lines of ../shared/data/corpus/sentences.jsonl.gz (written to a temporary JSONL corpus).
Model: a model folder; default a toy model built on the spot (bundled MiniLM encoder, 32 hand-set heads:
the encoder dominates the cost, so the ratio carries over to a trained model with the same encoder).
Single process: `InterpretableEmbedder.encode(texts, output="packed")` with torch's default threads, model loaded
and warmed up before the clock starts. Ray: the whole `embed()` call (snapshot of the corpus, actor start-up with
one model load per actor, encoding, Parquet writes, manifest) on a local Ray with every CPU; `ray.init` excluded.
"Inside the units": the actors' time in their units (`unit_seconds` in the manifest) over the actors, so the pass
less the actors' start-up (Ray Data's pool, the model loads) and their idle time at the end.
Last line: `embed_ray_vs_single: X` (Ray texts/s divided by single-process texts/s; target >= 0.9 on one node).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from _common import DATA, read_texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="texts (default 20000)")
    ap.add_argument("--model", default=None, help="model folder (default: a toy model built in a temp folder)")
    ap.add_argument("--batch-size", type=int, default=32, help="texts per encoder call on both sides (default 32: embed's CPU default)")
    ap.add_argument("--unit-rows", type=int, default=None, help="rows per unit (default n/16)")
    ap.add_argument("--threads", type=int, default=None, help="encoder threads per Ray actor (default: embed's, 1; actors = CPUs / threads)")
    ap.add_argument("--tokenize-stage", choices=["auto", "on", "off"], default="auto",
                    help="embed's CPU tokenizing stage before the actors (default auto: on with GPU actors only)")
    ap.add_argument("--corpus", default=DATA)
    a = ap.parse_args()

    import ray

    from cqg_ray.config import EmbedConfig
    from cqg_ray.embed import embed
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.toy import build_toy_model

    tmp = tempfile.mkdtemp(prefix="bench-embed-")
    model_path = a.model or build_toy_model(os.path.join(tmp, "model"))
    texts = read_texts(a.corpus, a.n)
    corpus = os.path.join(tmp, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")

    model = InterpretableEmbedder.load(model_path)
    model.encode(texts[:256], output="packed", batch_size=a.batch_size, progress=False)  # warm-up
    t0 = time.perf_counter()
    single = model.encode(texts, output="packed", batch_size=a.batch_size, progress=False)
    t_single = time.perf_counter() - t0
    del model

    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    cfg = EmbedConfig(batch_size=a.batch_size, unit_rows=a.unit_rows or max(250, len(texts) // 16), torch_threads=a.threads or EmbedConfig().torch_threads,
                      tokenize_stage=a.tokenize_stage)
    t0 = time.perf_counter()
    m = embed(model_path, [corpus], os.path.join(tmp, "out"), cfg, progress=False)
    t_ray = time.perf_counter() - t0
    assert m["counts"]["rows"] == len(texts) == len(single)

    n = len(texts)
    load = os.getloadavg()
    print(f"texts: {n}  cpus: {int(ray.cluster_resources().get('CPU', 0))}  actors: {m['counts']['actors']}  m: {m['m']}  "
          f"units: {m['counts']['units']}  tokenize stage: {m['counts']['tokenize_stage']}  load average (1/15 min) {load[0]:.1f}/{load[2]:.1f}")
    print(f"{'':44} {'seconds':>8} {'texts/s':>9}")
    print(f"{'single process InterpretableEmbedder.encode':44} {t_single:8.2f} {n / t_single:9.1f}")
    print(f"{'Ray Data embed(), end to end':44} {t_ray:8.2f} {n / t_ray:9.1f}")
    print(f"{'  of which the embedding pass':44} {n / m['texts_per_s']:8.2f} {m['texts_per_s']:9.1f}")
    busy = m["counts"]["unit_seconds"] / m["counts"]["actors"]  # an actor's seconds inside units: the pass less start-up and idle time
    print(f"{'  of which inside the units (per actor)':44} {busy:8.2f} {n / busy:9.1f}")
    print(f"embed_ray_vs_single: {t_single / t_ray:.3f}")


if __name__ == "__main__":
    main()
