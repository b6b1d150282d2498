"""What several benchmarks share: the real corpus sample they read (`python bench/X.py` puts this folder on sys.path)."""

import gzip
import json
import os

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "corpus", "sentences.jsonl.gz")


def read_texts(path: str, n: int, min_chars: int = 1, max_chars: int | None = None) -> list[str]:
    """The first n texts of a JSONL(.gz) corpus whose stripped length is within [min_chars, max_chars]."""
    texts = []
    with gzip.open(path, "rt", encoding="utf-8") if str(path).endswith(".gz") else open(path, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line).get("text", "").strip()
            if min_chars <= len(t) and (max_chars is None or len(t) <= max_chars):
                texts.append(t)
            if len(texts) == n:
                break
    return texts


def corpus_sample(n: int, seed: int = 0, min_chars: int = 40, max_chars: int = 300, pool: int = 50_000) -> list[str]:
    """n texts drawn (seeded) from the first ``pool`` texts of the shared corpus whose length is in range."""
    import random

    texts = read_texts(DATA, pool, min_chars=min_chars)
    random.Random(seed).shuffle(texts)
    return [t[:max_chars] for t in texts[:n]]


def cqg_prompts(n_prompts: int, seed: int = 0, n_pos: int = 6, n_neg: int = 12, max_chars: int = 200, k: int | None = None, with_clusters: bool = False,
                prompt: str = "paper"):
    """Real CQG prompts (A.1, or ``prompt="property"``: the property prompt with its worked examples, no keywords): the
    shared corpus embedded by the bundled encoder and clustered with faiss into ``k`` clusters (default ``n_prompts``);
    the prompt of cluster c (c < n_prompts) has n_pos texts of c and n_neg texts of the other clusters.
    ``with_clusters``: also return the clustered texts and their cluster labels."""
    import faiss
    import numpy as np

    from cqg_ray.encoder import load_encoder
    from cqg_ray.llm.prompts import clip_text, cqg_messages, property_messages

    messages = {"paper": cqg_messages, "property": property_messages}[prompt]

    k = k or n_prompts
    texts = corpus_sample(max(2000, 40 * k), seed)
    emb = load_encoder("bundled:all-MiniLM-L6-v2").encode(texts, batch_size=64)
    km = faiss.Kmeans(emb.shape[1], k, niter=20, seed=seed, spherical=True)
    km.train(emb)
    labels = km.index.search(emb, 1)[1][:, 0]
    rng = np.random.default_rng(seed)
    prompts = []
    for c in range(n_prompts):
        own, other = np.flatnonzero(labels == c), np.flatnonzero(labels != c)
        pos = rng.choice(own, min(n_pos, len(own)), replace=False)
        neg = rng.choice(other, n_neg, replace=False)
        prompts.append(messages([clip_text(texts[i], max_chars) for i in pos], [clip_text(texts[i], max_chars) for i in neg]))
    return (prompts, texts, labels) if with_clusters else prompts


def cpu_line() -> str:
    """The CPU model and the flags that decide engine choices (for the top of a bench's output)."""
    from cqg_ray.hardware import cpu_flags, cpu_model, max_isa

    model, flags = cpu_model(), cpu_flags(capped=False)
    keep = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni") if f in flags]
    capped = f"; kernels capped at {max_isa().upper()} (CQG_RAY_MAX_CPU_ISA)" if max_isa() else ""
    return f"cpu: {model}, {os.cpu_count()} cores; flags: {' '.join(keep) or 'none of avx2/avx512/amx'}{capped}"
