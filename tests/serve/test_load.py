"""A bounded load test on loopback: 64 concurrent clients, 2,000 requests, zero errors; p50/p95 and requests/s.

The figures are printed and written to tests/_artifacts/serve_load.json.
"""

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

CLIENTS, REQUESTS = 64, 2000
WORDS = "film movie doctor vaccine recipe election laptop river guitar court storm train family church war energy".split()


def request_for(i: int) -> tuple[str, dict]:
    text = f"request {i}: a short note about the {WORDS[i % len(WORDS)]} and the {WORDS[(7 * i) % len(WORDS)]}"
    if i % 10 == 0:
        return "/explain", {"text_a": text, "text_b": f"another note about the {WORDS[(3 * i) % len(WORDS)]}"}
    if i % 10 == 1:
        return "/v1/embeddings", {"model": "cqg-mbqa", "input": text}
    return "/embed", {"texts": [text]}


async def load(url: str, clients: int, requests: int) -> dict:
    import httpx

    latencies, failures = [], []
    counter = iter(range(requests))

    async def worker(c):
        for i in counter:
            path, body = request_for(i)
            t0 = time.perf_counter()
            try:
                r = await c.post(path, json=body)
                if r.status_code != 200:
                    failures.append(f"{path}: {r.status_code} {r.text[:200]}")
            except httpx.HTTPError as e:
                failures.append(f"{path}: {type(e).__name__} {e}")
            latencies.append(time.perf_counter() - t0)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for _ in range(clients)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "errors": len(failures), "first_errors": failures[:5],
            "seconds": round(wall, 2), "requests_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
            "max_ms": round(float(lat.max()), 1)}


@pytest.mark.slow
def test_load_on_loopback(server, client):
    before = client.get("/healthz").json()
    res = asyncio.run(load(server.url, CLIENTS, REQUESTS))
    after = client.get("/healthz").json()
    res["mean_batch"] = round((after["texts_seen"] - before["texts_seen"]) / max(1, after["batches"] - before["batches"]), 2)
    print("\nload test:", json.dumps(res))
    out = Path(__file__).resolve().parents[1] / "_artifacts" / "serve_load.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    assert res["requests"] == REQUESTS
    assert res["errors"] == 0, res["first_errors"]
    assert client.get("/healthz").status_code == 200
