"""Ray Serve dynamic batching: throughput with `@serve.batch` vs with batching off (max_batch_size=1), same load.

    python bench/serve.py [--clients 64] [--requests 1500] [--texts-per-request 1] [--batch 32] [--model MODEL]
                          [--via http|handle] [--gpus 1]

One replica of the app (`cqg_ray.serve.app`) on 127.0.0.1 (same max_ongoing_requests in both runs), driven over HTTP by `--clients` concurrent httpx
clients sending `--requests` POST /embed requests (real sentences from ../shared/data, each request
`--texts-per-request` texts). The two configurations run the same requests, in turns (off, on, off, on ...
`--rounds` times); each keeps its best round. Model: a folder, default a toy model built on the spot (bundled
MiniLM encoder, 32 hand-set heads; the encoder dominates the cost).
Before Serve starts, the model alone, as the batched replica holds it (its encoder backend, torch threads and the
service's encoder batch size), is timed on every text the load sends, one text per call and `--batch` texts per call
(in turns, `--rounds` times, each keeping its best):
the most batching can buy on this hardware (on a 2-core CPU about 2x for MiniLM; on a GPU far more).
Printed `serve_batching_speedup: X` (requests/s batched divided by requests/s unbatched); last line
`serve_batching_share: X`, X = (that speedup - 1) / (the encoder's own gain - 1): the share of what batching can buy that
Serve keeps (target >= 0.75).

    python bench/serve.py --peer infinity [--clients 64] [--requests 1500] [--replicas N] [--threads T]

The yardstick run: our app (encoder on its `auto` backend plus the heads, `--replicas` replicas of `--threads` CPU
each, default one per core) on POST /v1/embeddings against infinity-emb serving the same encoder folder (encoder
only, its torch engine on the CPU, every core) on POST /embeddings, both OpenAI-compatible, same texts, same
`drive` load generator. infinity-emb runs as a subprocess from its own virtualenv (`--infinity-bin`, default
/work/.venv-infinity/bin/infinity_emb; its pins clash with ours, see docs/serving.md). Each side keeps its best of
`--rounds`. Last line: `ours_vs_infinity: X` (our requests/s divided by infinity's; target >= 1).

    python bench/serve.py --tune 2x1:32:8,1x2:32:8,2x1:32:32 [--model MODEL] [--rounds 2]

Tuning: our POST /v1/embeddings (encoder on its `auto` backend) at each layout REPLICASxTHREADS:MAX_BATCH:ENCODER_BATCH
(replicas, CPUs and encoder threads per replica, `max_batch_size`, `encoder_batch_size`), same load, in turns.
Last line: `serve_tuned_vs_first: X` (the fastest layout's requests/s divided by the first layout's).

Every mode starts Ray with the throughput settings `cqg-ray serve` uses (`THROUGHPUT_ENV`); `--plain-ray` leaves Ray
Serve's defaults.
"""

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from _common import DATA, read_texts

from cqg_ray.config import ServeConfig


async def drive(url: str, bodies: list[dict], clients: int, route: str = "/embed", counters: bool = True) -> dict:
    """`clients` concurrent httpx clients POSTing `bodies` to `route`; counters: read our /healthz before and after
    (texts seen, batches), which a peer server does not have (and which count one replica only: off for several).
    Each client has its own connection: one pool of `clients` connections costs the load generator, on the same cores
    as the server, CPU that grows with the connections and with answers arriving together (httpcore scans its pool at
    every request's end: 2.4 ms a request at 64 clients one answer at a time, 4.6-7.7 when a batch answers together)."""
    import httpx

    latencies, errors = [], 0
    todo = iter(bodies)
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def worker():
        nonlocal errors
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=one) as c:
            for body in todo:
                t0 = time.perf_counter()
                r = await c.post(route, json=body)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

    async with httpx.AsyncClient(base_url=url, timeout=300, limits=one) as c:
        zero = {"texts_seen": 0, "batches": 0}
        before = (await c.get("/healthz")).json() if counters else zero
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
        after = (await c.get("/healthz")).json() if counters else zero
    lat = np.array(latencies) * 1000
    texts = after["texts_seen"] - before["texts_seen"] if counters else sum(len(b.get("input", b.get("texts", []))) for b in bodies)
    return {"rps": len(bodies) / wall, "texts_per_s": texts / wall, "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)), "errors": errors,
            "mean_batch": texts / max(1, after["batches"] - before["batches"]) if counters else float("nan"), "seconds": wall}


async def drive_handle(handle, bodies: list[dict], clients: int) -> dict:
    """The same load through a DeploymentHandle (Serve's router and the replica's batch queue, no HTTP proxy)."""
    from cqg_ray.serve.protocol import EmbedRequest

    latencies, errors = [], 0
    todo = iter(bodies)

    async def worker():
        nonlocal errors
        for body in todo:
            t0 = time.perf_counter()
            try:
                await handle.embed.remote(EmbedRequest(**body))
            except Exception:
                errors += 1
            latencies.append(time.perf_counter() - t0)

    before = await handle.health.remote()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    after = await handle.health.remote()
    lat = np.array(latencies) * 1000
    texts = after.texts_seen - before.texts_seen
    return {"rps": len(bodies) / wall, "texts_per_s": texts / wall, "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)), "errors": errors, "mean_batch": texts / max(1, after.batches - before.batches),
            "seconds": wall}


def encoder_ceiling(model_path: str, texts: list[str], cfg: ServeConfig, gpus: float, rounds: int = 1) -> dict:
    """What batching can buy at most on this hardware: the model as one replica holds it (the config's encoder backend
    and torch threads, the service's own encoder batch size), alone (no Serve, no HTTP), over the texts the load
    sends, texts/s one text per call vs `cfg.max_batch_size` texts per call, the best of `rounds` rounds taken in turns."""
    import torch

    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.serve.service import default_encoder_batch_size

    before = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads or before)
    model = InterpretableEmbedder.load(model_path, device="cuda" if gpus else "cpu", backend=cfg.encoder_backend)
    chunk = cfg.encoder_batch_size or default_encoder_batch_size(model)  # what EmbeddingService passes
    model.encode(texts[: cfg.max_batch_size], output="probs", batch_size=chunk, progress=False)  # warm-up
    rates = {}
    for _ in range(rounds):  # in turns, each size keeping its best round, as the served sides do
        for size in (1, cfg.max_batch_size):
            t0 = time.perf_counter()
            for i in range(0, len(texts), size):
                model.encode(texts[i : i + size], output="probs", batch_size=chunk, progress=False)
            rates[size] = max(rates.get(size, 0.0), len(texts) / (time.perf_counter() - t0))
    torch.set_num_threads(before)
    return {"one": rates[1], "batched": rates[cfg.max_batch_size], "ratio": rates[cfg.max_batch_size] / rates[1],
            "encoder_batch": chunk, "backend": model.encoder.backend}


def wait_http(url: str, seconds: float, proc=None) -> None:
    """Poll GET url until it answers 200 (or the process dies, or `seconds` pass)."""
    import httpx

    t0 = time.time()
    while time.time() - t0 < seconds:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the peer server exited with code {proc.returncode} before answering {url}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"no answer from {url} after {seconds:.0f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(a, model_path: str, texts: list[str]) -> None:
    """Ours (/v1/embeddings, encoder + heads) vs infinity-emb (/embeddings, encoder only), same load."""
    import json
    import subprocess

    import ray
    from ray import serve

    from cqg_ray.encoder import resolve_encoder_path
    from cqg_ray.serve.app import build_app

    if not os.path.exists(a.infinity_bin):
        sys.exit(f"infinity-emb not found at {a.infinity_bin}: make a separate venv and pip install 'infinity-emb[server]' "
                 "(see docs/serving.md), or pass --infinity-bin")
    encoder = json.load(open(os.path.join(model_path, "config.json")))["encoder"]
    k = a.texts_per_request
    chunks = [texts[i * k : (i + 1) * k] for i in range(a.requests)]
    results = {}

    port = free_port()
    cmd = [a.infinity_bin, "v2", "--model-id", resolve_encoder_path(encoder), "--served-model-name", "enc", "--engine", "torch",
           "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--batch-size", str(a.batch), "--no-bettertransformer"]
    log = open(os.path.join(tempfile.mkdtemp(prefix="bench-infinity-"), "infinity.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"})
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 300, proc)
        bodies = [{"model": "enc", "input": c} for c in chunks]
        url = f"http://127.0.0.1:{port}"
        asyncio.run(drive(url, bodies[:200], a.clients, "/embeddings", counters=False))  # warm-up
        for r in range(a.rounds):
            res = asyncio.run(drive(url, bodies, a.clients, "/embeddings", counters=False))
            print(f"round {r + 1} infinity-emb: {res['rps']:.1f} req/s  p50 {res['p50']:.0f} ms  errors {res['errors']}", flush=True)
            if "infinity" not in results or res["rps"] > results["infinity"]["rps"]:
                results["infinity"] = res
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    print(f"infinity log: {log.name}")

    replicas = a.replicas or max(1, (os.cpu_count() or 1) // a.threads)
    cfg = ServeConfig(num_replicas=replicas, torch_threads=a.threads, num_cpus_per_replica=a.threads, max_batch_size=a.batch,
                      batch_wait_timeout_s=a.wait, max_ongoing_requests=max(a.clients, 4 * a.batch), encoder_batch_size=a.encoder_batch)
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    serve.run(build_app(model_path, cfg), name="bench", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    bodies = [{"model": cfg.model_name, "input": c} for c in chunks]
    asyncio.run(drive(url, bodies[:200], a.clients, "/v1/embeddings", counters=replicas == 1))  # warm-up
    for r in range(a.rounds):
        res = asyncio.run(drive(url, bodies, a.clients, "/v1/embeddings", counters=replicas == 1))
        print(f"round {r + 1} ours: {res['rps']:.1f} req/s  p50 {res['p50']:.0f} ms  mean batch {res['mean_batch']:.1f}  errors {res['errors']}", flush=True)
        if "ours" not in results or res["rps"] > results["ours"]["rps"]:
            results["ours"] = res
    serve.shutdown()

    from _common import cpu_line

    print(f"\n{cpu_line()}; load average (1/15 min) {os.getloadavg()[0]:.1f}/{os.getloadavg()[2]:.1f}")
    print(f"{a.requests} requests x {k} text(s), {a.clients} concurrent clients; ours: {replicas} replica(s) x {a.threads} CPU, "
          f"encoder backend {cfg.encoder_backend}, max_batch_size {a.batch}, encoder_batch_size {a.encoder_batch or 'default'}, "
          f"{'Ray Serve defaults' if a.plain_ray else 'throughput settings'}; "
          f"infinity-emb: torch engine, CPU, batch {a.batch}")
    print(f"{'server':34} {'req/s':>8} {'texts/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'errors':>7}")
    for name, label in (("ours", "ours /v1/embeddings (enc + heads)"), ("infinity", "infinity-emb /embeddings (enc)")):
        res = results[name]
        print(f"{label:34} {res['rps']:8.1f} {res['texts_per_s']:9.1f} {res['p50']:8.0f} {res['p95']:8.0f} {res['errors']:7d}")
    print(f"ours_vs_infinity: {results['ours']['rps'] / results['infinity']['rps']:.2f}")


def run_tune(a, model_path: str, texts: list[str]) -> None:
    """Our /v1/embeddings under the same load for each `--tune` layout (replicas x threads, max_batch_size,
    encoder_batch_size), in turns for `--rounds` rounds; each keeps its best round."""
    import ray
    from ray import serve

    from cqg_ray.serve.app import build_app

    specs = []
    for spec in a.tune.split(","):
        try:
            layout, batch, enc_batch = spec.strip().split(":")
            replicas, threads = (int(x) for x in layout.split("x"))
            specs.append((spec.strip(), replicas, threads, int(batch), int(enc_batch)))
        except ValueError:
            sys.exit(f"--tune: {spec!r} is not REPLICASxTHREADS:MAX_BATCH:ENCODER_BATCH (e.g. 1x2:32:8)")
    k = a.texts_per_request
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    url, best = f"http://127.0.0.1:{port}", {}
    for r in range(a.rounds):
        for name, replicas, threads, batch, enc_batch in specs:
            cfg = ServeConfig(num_replicas=replicas, torch_threads=threads, num_cpus_per_replica=threads, max_batch_size=batch,
                              batch_wait_timeout_s=a.wait, encoder_batch_size=enc_batch, max_ongoing_requests=max(a.clients, 4 * batch))
            serve.run(build_app(model_path, cfg), name="bench", route_prefix="/")
            bodies = [{"model": cfg.model_name, "input": texts[i * k : (i + 1) * k]} for i in range(a.requests)]
            asyncio.run(drive(url, bodies[:200], a.clients, "/v1/embeddings", counters=replicas == 1))  # warm-up
            res = asyncio.run(drive(url, bodies, a.clients, "/v1/embeddings", counters=replicas == 1))
            print(f"round {r + 1} {name}: {res['rps']:.1f} req/s  p50 {res['p50']:.0f} ms  mean batch {res['mean_batch']:.1f}  "
                  f"errors {res['errors']}", flush=True)
            if name not in best or res["rps"] > best[name]["rps"]:
                best[name] = res
            serve.delete("bench")
    serve.shutdown()

    from _common import cpu_line

    print(f"\n{cpu_line()}; load average (1/15 min) {os.getloadavg()[0]:.1f}/{os.getloadavg()[2]:.1f}")
    print(f"POST /v1/embeddings, {a.requests} requests x {k} text(s), {a.clients} concurrent clients, encoder backend "
          f"{ServeConfig().encoder_backend}, batch_wait_timeout_s {a.wait}; best of {a.rounds} round(s)")
    print(f"{'replicas x threads:max_batch:encoder_batch':44} {'req/s':>8} {'texts/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'mean batch':>11} {'errors':>7}")
    for name, res in best.items():
        print(f"{name:44} {res['rps']:8.1f} {res['texts_per_s']:9.1f} {res['p50']:8.0f} {res['p95']:8.0f} {res['mean_batch']:11.1f} {res['errors']:7d}")
    first, top = specs[0][0], max(best, key=lambda n: best[n]["rps"])
    print(f"fastest: {top}; the first layout ({first}) is the yardstick")
    print(f"serve_tuned_vs_first: {best[top]['rps'] / best[first]['rps']:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--texts-per-request", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32, help="max_batch_size of the batched configuration")
    ap.add_argument("--wait", type=float, default=ServeConfig().batch_wait_timeout_s, help="batch_wait_timeout_s of the batched configuration")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ongoing", type=int, default=None, help="max_ongoing_requests of both (default max(clients, 4*batch); 0: defaults)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and CPUs) of the replica")
    ap.add_argument("--gpus", type=float, default=0, help="GPUs of the replica (the encoder then runs on the GPU)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--corpus", default=DATA)
    ap.add_argument("--via", choices=["http", "handle"], default="http",
                    help="http: httpx clients through Serve's HTTP proxy (what users see); handle: the same load through a "
                         "DeploymentHandle from the driver (the replica and its batch queue without the proxy's per-request cost)")
    ap.add_argument("--peer", choices=["infinity"], default=None, help="instead of batching on/off: ours against this embedding server")
    ap.add_argument("--infinity-bin", default=os.environ.get("INFINITY_BIN", "/work/.venv-infinity/bin/infinity_emb"))
    ap.add_argument("--replicas", type=int, default=None, help="--peer: our replicas (default: CPUs // --threads)")
    ap.add_argument("--encoder-batch", type=int, default=None, help="--peer: our encoder_batch_size (default: the config's)")
    ap.add_argument("--plain-ray", action="store_true", help="Ray Serve's own defaults instead of the throughput settings that "
                    "`cqg-ray serve` starts a local Ray with (cqg_ray.serve.cli.THROUGHPUT_ENV)")
    ap.add_argument("--tune", default=None, help="instead of batching on/off: our /v1/embeddings at each of these comma-separated "
                    "layouts REPLICASxTHREADS:MAX_BATCH:ENCODER_BATCH (e.g. 1x2:32:8,2x1:32:8,2x1:32:32); last line serve_tuned_vs_first")
    a = ap.parse_args()
    if not a.plain_ray:
        from cqg_ray.serve.cli import use_throughput_env

        use_throughput_env()  # before any ray.init: the local Ray's processes inherit it, as under `cqg-ray serve`

    import ray
    from ray import serve

    from cqg_ray.serve.app import build_app
    from cqg_ray.mbqa.toy import build_toy_model

    model_path = a.model or build_toy_model(os.path.join(tempfile.mkdtemp(prefix="bench-serve-"), "model"))
    texts = read_texts(a.corpus, a.requests * a.texts_per_request, min_chars=20, max_chars=300)
    k = a.texts_per_request
    bodies = [{"texts": texts[i * k : (i + 1) * k]} for i in range(a.requests)]
    if a.peer:
        return run_peer(a, model_path, texts)
    if a.tune:
        return run_tune(a, model_path, texts)

    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    url = f"http://127.0.0.1:{port}"
    # by default the two deployments differ in batching only; --ongoing 0 gives each its config default
    # (4 x max_batch_size, at least 16: with batching off the proxy then queues most requests itself)
    same = {"max_ongoing_requests": a.ongoing or max(a.clients, 4 * a.batch)} if a.ongoing != 0 else {}
    same.update(torch_threads=a.threads, num_cpus_per_replica=a.threads, num_gpus_per_replica=a.gpus)
    configs = {"off (max_batch_size=1)": ServeConfig(max_batch_size=1, batch_wait_timeout_s=0.0, **same),
               f"on  (max_batch_size={a.batch})": ServeConfig(max_batch_size=a.batch, batch_wait_timeout_s=a.wait, **same)}
    # the ceiling: the batched configuration's model alone, on every text the load sends (before Serve takes the cores)
    ceiling = encoder_ceiling(model_path, texts, configs[f"on  (max_batch_size={a.batch})"], a.gpus, a.rounds)
    best: dict[str, dict] = {}
    for r in range(a.rounds):
        for name, cfg in configs.items():
            handle = serve.run(build_app(model_path, cfg), name="bench", route_prefix="/")
            if a.via == "http":
                asyncio.run(drive(url, bodies[: min(200, len(bodies))], a.clients))  # warm-up
                res = asyncio.run(drive(url, bodies, a.clients))
            else:
                asyncio.run(drive_handle(handle, bodies[: min(200, len(bodies))], a.clients))
                res = asyncio.run(drive_handle(handle, bodies, a.clients))
            print(f"round {r + 1} {name}: {res['rps']:.1f} req/s  p50 {res['p50']:.0f} ms  mean batch {res['mean_batch']:.1f}", flush=True)
            if name not in best or res["rps"] > best[name]["rps"]:
                best[name] = res
    serve.shutdown()

    load = os.getloadavg()
    print(f"\nvia {a.via}: {a.requests} requests x {k} text(s), {a.clients} concurrent clients, "
          f"1 replica ({a.threads} CPU, {a.threads} torch thread(s), {a.gpus:g} GPU), "
          f"{int(ray.cluster_resources().get('CPU', 0))} CPUs, load average (1/15 min) {load[0]:.1f}/{load[2]:.1f}")
    print(f"{'batching':28} {'req/s':>8} {'texts/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'mean batch':>11} {'errors':>7}")
    for name, res in best.items():
        print(f"{name:28} {res['rps']:8.1f} {res['texts_per_s']:9.1f} {res['p50']:8.0f} {res['p95']:8.0f} {res['mean_batch']:11.1f} {res['errors']:7d}")
    print(f"encoder alone, no Serve ({ceiling['backend']}, encoder batch {ceiling['encoder_batch']}, {len(texts)} texts, best of {a.rounds}): "
          f"{ceiling['one']:.1f} texts/s one per call, {ceiling['batched']:.1f} texts/s {a.batch} per call: "
          f"batching can buy at most {ceiling['ratio']:.2f}x here")
    off, on = best[list(configs)[0]], best[list(configs)[1]]
    speedup = on["rps"] / off["rps"]
    print(f"serve_batching_speedup: {speedup:.2f}")
    # the share of what batching can buy that Serve keeps: (Serve's gain - 1) / (the encoder's own gain - 1)
    share = (speedup - 1) / (ceiling["ratio"] - 1) if ceiling["ratio"] > 1 else float("nan")  # nan: batching buys nothing here
    print(f"serve_batching_share: {share:.2f}")


if __name__ == "__main__":
    main()
