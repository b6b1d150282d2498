"""`cqg-ray serve cqg-minilm-ref`: the shipped model served by name, over real HTTP."""

import numpy as np


def test_the_shipped_model_serves_by_name(server):
    import httpx
    from ray import serve

    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.serve.cli import start

    cfg = server.cfg.model_copy(update={"route_prefix": "/shipped", "num_cpus_per_replica": 0.25})
    url = start("cqg-minilm-ref", cfg, name="shipped")
    try:
        texts = ["A man is playing a guitar.", "The central bank raised interest rates."]
        r = httpx.post(url + "/embed", json={"texts": texts, "output": "probs"}, timeout=120)
        assert r.status_code == 200, r.text
        got = np.array(r.json()["embeddings"], dtype=np.float32)
        model = InterpretableEmbedder.load("cqg-minilm-ref", device="cpu")
        want = model.encode(texts, output="probs", progress=False)
        assert got.shape == want.shape == (2, model.m)
        np.testing.assert_allclose(got, want, atol=1e-3)
    finally:
        serve.delete("shipped")
