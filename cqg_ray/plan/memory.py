"""Predicted peak memory per stage of the driver and of each kind of worker (pure; estimates).

Each process is priced by what it holds at its peak, from the plan's counts and the config; nothing is measured here
except ``PROCESS_BASE``. Byte sizes (the model in docs/cluster.md):

- every process: ``PROCESS_BASE`` (Python with numpy, pyarrow and Ray; the label driver measured 320 MB at 100k pairs,
  bench/label_scale.py), plus ``TORCH_BASE`` where torch runs (an assumption);
- a text: prompt_tokens_per_text x chars_per_token bytes, twice (Python strings and Arrow); an embedding d x 4 bytes;
- model weights: parameters x bytes per parameter (``WEIGHTS``: fp32 encoders, bf16 for vLLM's 7B, ~4.85 bits a weight
  for the bundled Q4_K_M GGUFs, plus ``PARAMS`` x 4 or 2 bytes where the torch engine, as resolved on this CPU, scores
  or generates; the GGUF not at all where torch does both, as llama.cpp is then never loaded); an engine's KV cache
  and activations are not counted (vLLM's are on the GPU);
- driver plans: the labelling plan's arrays 17 bytes a pair (text int64, question int32, source int8, prompt slot
  int32) and 16 a prompt, its Arrow table and Parquet bytes 4 a pair and 16 a prompt each, held together at the write;
  the clusters 32 bytes a text (doc id ~24, label 8) and each text's place in the corpus shards 12 (shard int32, row
  int64); the cluster driver its centroids, the k-means task every doc id and its sample at d x 4 bytes a point;
- tasks: the keywords task the clusters' keyword texts and their sparse counts; the ledger index task every key of the
  labels ledger while it sorts them (``KEY_INDEX_BYTES`` a request, measured by bench/scale.py);
- train workers: their shard (labelled texts / workers embeddings, pairs / workers x 9 bytes: question int32, answer,
  P(yes) float32) and the heads with gradients and Adam's two moments (4 copies of m x (hidden x (d + 2) + 1) floats).
"""

from __future__ import annotations

from cqg_ray.config import PipelineConfig
from cqg_ray.plan.tokens import Workload

PROCESS_BASE = 300e6
TORCH_BASE = 500e6
WEIGHTS = {  # bytes of a model's weights as loaded: parameters x bytes per parameter
    "WhereIsAI/UAE-Large-V1": 335e6 * 4,
    "bundled:all-MiniLM-L6-v2": 22.7e6 * 4,
    "sentence-transformers/all-MiniLM-L6-v2": 22.7e6 * 4,
    "Qwen/Qwen2.5-7B-Instruct": 7.6e9 * 2,
    "bundled:qwen2.5-coder-0.5b": 0.49e9 * 4.85 / 8,
    "bundled:qwen2.5-coder-1.5b": 1.54e9 * 4.85 / 8,
    "bundled:smollm2-135m": 0.135e9 * 5 / 8,
}
PARAMS = {"bundled:qwen2.5-coder-0.5b": 0.49e9, "bundled:qwen2.5-coder-1.5b": 1.54e9, "bundled:smollm2-135m": 0.135e9}
PAIR_BYTES, PROMPT_BYTES = 17, 16  # the labelling plan's arrays
ID_BYTES = 24  # a doc id string
PLACE_BYTES = 12  # a text's (shard, row) in the corpus shards
KEY_INDEX_BYTES = 380  # the ledger index task's peak a request (32-byte keys read, concatenated, sorted): 640 in bench/scale.py
# with hex keys, scaled by what the binary keys cut from the build's peak on a 1.2M-key ledger (+387 -> +226 MB)
KEYWORD_COUNT_BYTES = 160  # a keyword text's sparse word counts (~10 words x int32 index + float64 count + the vectorizer's copy)


def llm_model(cfg: PipelineConfig) -> str:
    llm = cfg.llm
    return {"llamacpp": llm.llamacpp.model, "vllm": llm.vllm.model, "openai": "", "fake": ""}[llm.backend]


def llm_weights(cfg: PipelineConfig, model: str, work: str) -> tuple[float, str]:
    """(bytes, what) of an embedded model's weights for one kind of work (``score`` or ``generate``): the GGUF, plus
    its weights dequantised for the torch engine where that engine (as resolved on this CPU) does the work; those alone
    where torch does both kinds of work (the backend then never loads llama.cpp)."""
    from cqg_ray.llm.base import resolve_engine

    gguf = WEIGHTS.get(model, 0.0)
    if cfg.llm.backend != "llamacpp" or model not in PARAMS:
        return gguf, f"{model} weights{'' if gguf else ' (unknown model: not counted)'}"
    setting = cfg.llm.llamacpp.score_engine if work == "score" else cfg.llm.llamacpp.generate_engine
    engine = resolve_engine(setting, work=work)
    if engine == "llamacpp":
        return gguf, f"{model} weights"
    per = 4 if engine == "torch-float32" else 2
    doing = f"{engine} {'scores' if work == 'score' else 'generates'}"
    other = "generate" if work == "score" else "score"
    if resolve_engine(getattr(cfg.llm.llamacpp, f"{other}_engine"), work=other) != "llamacpp":  # torch only: no GGUF loaded
        return PARAMS[model] * per, f"{model} weights in {engine.split('-')[1]} ({doing}; both engines torch, no GGUF held)"
    return gguf + PARAMS[model] * per, f"{model} GGUF and its weights in {engine.split('-')[1]} ({doing})"


def memory_plan(cfg: PipelineConfig, counts: dict, dim: int, w: Workload = Workload()) -> list[dict]:
    """Rows {stage, process, bytes, holds}: the driver and each worker kind of every stage, at its peak (estimates)."""
    N, k, d, m = counts["docs"], counts["clusters"], dim, counts["questions"]
    pairs, prompts, texts = counts["label_pairs"], counts["label_prompts"], counts["label_texts"]
    text = 2 * w.prompt_tokens_per_text * w.chars_per_token
    enc = WEIGHTS.get(cfg.encode.model)
    llm_name = llm_model(cfg)
    heads = m * (cfg.train.hidden * (d + 2) + 1) * 4
    unit = cfg.encode.unit_rows
    batch_prompts = max(1, 10_000 // cfg.label.questions_per_prompt)  # label_work.batch_rows
    workers = cfg.train.num_workers
    sample = min(N, k * cfg.cluster.max_points_per_centroid)
    rows = []

    def add(stage, process, nbytes, holds):
        rows.append({"stage": stage, "process": process, "bytes": int(round(nbytes)), "holds": holds})

    add("prepare", "driver", PROCESS_BASE, "base")
    add("prepare", "reader task", PROCESS_BASE + cfg.corpus.rows_per_shard * text, f"one shard of {cfg.corpus.rows_per_shard:,} texts")
    add("encode", "driver", PROCESS_BASE, "base (the units)")
    add("encode", "encoder actor", PROCESS_BASE + TORCH_BASE + (enc or 0) + unit * (text + d * 4),
        f"encoder weights{'' if enc else ' (unknown model: not counted)'}, a unit of {unit:,} texts and embeddings")
    add("cluster", "driver", PROCESS_BASE + k * d * 4, "the centroids and counters")
    add("cluster", "k-means task", PROCESS_BASE + (sample + k) * d * 4 + N * ID_BYTES,
        f"k-means sample {sample:,} x {d}, centroids, every text's id (to draw the sample)")
    add("cqg", "driver", PROCESS_BASE + counts["candidates"] * d * 4 + N * (ID_BYTES + 8 + PLACE_BYTES),
        "candidate question embeddings (dedup), the clusters, each text's place")
    kw = k * cfg.cqg.keyword_texts if cfg.cqg.prompt == "property" and cfg.cqg.keywords > 0 else 0
    if kw:
        add("cqg", "keywords task", PROCESS_BASE + kw * (text + ID_BYTES + KEYWORD_COUNT_BYTES),
            f"{kw:,} keyword texts ({cfg.cqg.keyword_texts} a cluster) and their sparse word counts")
    if llm_name:
        writer = cfg.cqg.writer_model or llm_name
        wb, what = llm_weights(cfg, writer, "generate")
        add("cqg", "writer engine", PROCESS_BASE + wb, what)
        sb, what = llm_weights(cfg, llm_name, "score")
        add("cqg", "probe engine", PROCESS_BASE + sb, what)
    add("label", "driver", PROCESS_BASE + N * (ID_BYTES + 8 + PLACE_BYTES) + pairs * PAIR_BYTES + prompts * PROMPT_BYTES
        + 2 * (pairs * 4 + prompts * 16), f"clusters, places, plan arrays ({pairs:,} pairs, {prompts:,} prompts), plan table and Parquet bytes")
    requests = pairs if cfg.llm.answer_mode == "single" else prompts
    add("label", "ledger index", PROCESS_BASE + requests * KEY_INDEX_BYTES, f"every ledger key of {requests:,} requests, sorted")
    add("label", "label worker", PROCESS_BASE + batch_prompts * text, f"a batch of {batch_prompts:,} prompts' texts")
    if llm_name:
        sb, what = llm_weights(cfg, cfg.label.model or llm_name, "score" if cfg.llm.answer_mode == "single" else "generate")
        add("label", "LLM engine", PROCESS_BASE + sb + batch_prompts * text, f"{what}, a batch of texts")
    add("train", "driver", PROCESS_BASE + texts * ID_BYTES, "the labels' doc ids (held-out split)")
    add("train", f"train worker x{workers}", PROCESS_BASE + TORCH_BASE + texts / workers * d * 4 + pairs / workers * 9 + 4 * heads,
        f"its shard ({texts / workers:,.0f} embeddings, {pairs / workers:,.0f} labels), heads + grads + Adam")
    add("embed", "driver", PROCESS_BASE, "base (the units)")
    add("embed", "encoder actor", PROCESS_BASE + TORCH_BASE + (enc or 0) + heads + unit * (text + d * 4 + m * 4),
        f"encoder weights, heads, a unit of {unit:,} texts, embeddings and probabilities")
    return rows


def format_memory(rows: list[dict]) -> list[str]:
    """The table's lines: stage, process, peak (GB), holds."""
    lines = ["predicted peak memory per process (estimates: docs/cluster.md#memory; a worker kind's figure is per process)",
             f"{'stage':<8} {'process':<16} {'peak GB':>8}  holds"]
    for r in rows:
        lines.append(f"{r['stage']:<8} {r['process']:<16} {r['bytes'] / 1e9:>8.2f}  {r['holds']}")
    return lines
