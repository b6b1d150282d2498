"""Embedding on a GPU: `InterpretableEmbedder.encode` and the embed stage's work against bare sentence-transformers.

    python bench/gpu_embed.py                                     # MiniLM-L6's shape, cuda, 100,000 texts
    python bench/gpu_embed.py --device cpu --shape tiny --texts 2000   # the same code on a CPU in about a minute

Random weights of a sentence-transformers model's shape (MiniLM-L6's by default; --shape tiny: 2 layers of 64) with
that model's real tokenizer, read from --model-dir (default the bundled MiniLM folder; only its config and tokenizer
files are read, so a folder without weights will do: a lent GPU machine reaches no hub). Speed depends on shapes only.
Texts: --texts-file (.jsonl or .jsonl.gz with "text"), else the shared training corpus, else the
repository's fixture, repeated to --texts.

1. Bare: ``st.encode(texts, batch_size=B, convert_to_tensor=True)`` at each B of --batches, in float32 and (on a GPU)
   float16; the best B of each is kept. Same texts, truncation and process as the rest.
2. ``encode`` with m random heads (each m of --ms), outputs bits (packed) and sparse, under the shipped model's budget
   (top 112 ranked by p - mean, floor 0.5, centred values) with a fixed mean of 0.3, so that every text has 112 active
   questions whatever the random heads say; the encoder in float32 and (on a GPU) float16, at that dtype's best B.
3. The embed stage's work: what one of its actors does per unit (`cqg_ray.embed.EmbedUnits.write_unit`: encode,
   the output table, an atomic Parquet file) over the texts in units of --unit-rows, at m = the largest of --ms,
   sparse output. With Ray installed and not --skip-stage, also the whole `cqg-ray embed` stage, once with its actors
   tokenizing and once with its CPU tokenizing stage before them (Ray started before both):
   ``gpu_embed_stage_vs_bare: X``, the stage as `tokenize_stage=auto` runs it on this device over the best bare.
   (`scripts/gpu_pack.py` packs Ray for a GPU machine without it.) Where Ray fails to start, the error is printed there.
1b. The encoder alone: ``Encoder.encode_tensor`` (sentence-transformers' loop with each mini-batch tokenized ahead on a
   thread) at each B, the best kept per dtype; with the bounds of its two parts, each alone in one thread (tokenizing
   to arrays; the model on inputs already on the device).
Timed runs are interleaved, median of --repeats. Printed: texts/s, each over the best bare run, peak device memory and
peak RSS; ``gpu_embed_overlap_vs_bare: X`` (the encoder alone, best, over the best bare). Last line:
``gpu_embed_m10000_sparse_vs_bare: X`` (the best encode at m = 10,000, sparse, over the best bare; the name follows the
largest of --ms).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "sentences.jsonl.gz"
FIXTURE = ROOT / "tests" / "fixtures" / "corpus_400.jsonl"
SHAPES = {"minilm-l6": {}, "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)}
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.onnx")


def corpus_texts(n: int, path: str | None) -> tuple[list[str], str]:
    """n texts of ``path`` (JSONL, .gz or not), else of the shared corpus, else of the fixture, repeated to n; and the source."""
    from _common import read_texts

    src = path or str(CORPUS if CORPUS.exists() else FIXTURE)
    texts = read_texts(src, n)
    return (texts * (n // len(texts) + 1))[:n], src


def random_st(model_dir: str, shape: str, device: str, work: Path):
    """A SentenceTransformer with model_dir's tokenizer, pooling and config (of ``shape``), random weights."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoModel

    src, dst = Path(model_dir), work / "encoder"
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in WEIGHTS or n.startswith(".")])
    cfg = AutoConfig.from_pretrained(dst)
    for key, value in SHAPES[shape].items():
        setattr(cfg, key, value)
    for pooling in dst.glob("*/config.json"):  # the pooling module's width follows the shape
        pc = json.loads(pooling.read_text())
        if "word_embedding_dimension" in pc:
            pooling.write_text(json.dumps({**pc, "word_embedding_dimension": cfg.hidden_size}))
    torch.manual_seed(0)
    AutoModel.from_config(cfg).save_pretrained(dst)
    return SentenceTransformer(str(dst), device=device), str(dst)


def timed(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="minilm-l6")
    ap.add_argument("--model-dir", default=None, help="a sentence-transformers folder (config and tokenizer; weights unused)")
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--texts-file", default=None)
    ap.add_argument("--ms", default="636,10000", help="comma-separated numbers of questions")
    ap.add_argument("--batches", default="128,256,512,1024", help="encoder batch sizes tried for the bare runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--unit-rows", type=int, default=20_000, help="texts per unit of the embed stage's work")
    ap.add_argument("--skip-stage", action="store_true", help="not the whole Ray embed stage, only its units' work")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()

    import numpy as np
    import torch

    from cqg_ray.encoder import Encoder, resolve_encoder_path
    from cqg_ray.mbqa.budget import Budget
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.heads import StackedHeads

    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ms = [int(x) for x in a.ms.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    texts, source = corpus_texts(a.texts, a.texts_file)
    work = Path(tempfile.mkdtemp(prefix="gpu_embed_"))
    st, st_dir = random_st(a.model_dir or resolve_encoder_path("bundled:all-MiniLM-L6-v2"), a.shape, a.device, work)
    d = (getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension)()
    dtypes = ["float32", "float16"] if cuda else ["float32"]
    models = {"float32": st}
    if cuda:
        models["float16"] = copy.deepcopy(st).half()
    print(f"device {a.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}) | torch {torch.__version__} | shape {a.shape} (d={d}) | "
          f"{len(texts)} texts from {source} | max_seq_length {st.max_seq_length}")
    res: dict = {"device": a.device, "shape": a.shape, "texts": len(texts), "d": d}

    def peak_gib():
        return round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None

    # 1. bare: each batch size once, the best kept per dtype
    best_b = {}
    print("\nbare sentence-transformers, each batch size once:")
    for dt in dtypes:
        rates = {}
        for b in batches:
            rates[b] = len(texts) / timed(lambda: models[dt].encode(texts, batch_size=b, convert_to_tensor=True), sync)
        best_b[dt] = max(rates, key=rates.get)
        print(f"  {dt:<8}" + "  ".join(f"B={b}: {r:,.0f}/s" for b, r in rates.items()) + f"  -> B={best_b[dt]}")

    # 1b. the encoder's own loop (`Encoder.encode_tensor`: tokenized ahead on a thread), each batch size once
    encoders = {dt: Encoder(st_dir, models[dt], "torch-float32" if dt == "float32" else "torch-float16", a.device) for dt in dtypes}
    best_o = {}
    print("\nthe encoder alone (`Encoder.encode_tensor`, tokenized ahead), each batch size once:")
    for dt in dtypes:
        rates = {b: len(texts) / timed(lambda: encoders[dt].encode_tensor(texts, batch_size=b), sync) for b in batches}
        best_o[dt] = max(rates, key=rates.get)
        print(f"  {dt:<8}" + "  ".join(f"B={b}: {r:,.0f}/s" for b, r in rates.items()) + f"  -> B={best_o[dt]}")
    res["bounds"] = bounds(encoders[dtypes[-1]], texts, best_o[dtypes[-1]], sync)
    print(f"  bounds at B={best_o[dtypes[-1]]} ({dtypes[-1]}), each part alone in one thread: "
          + ", ".join(f"{k} {v:,.0f}/s" for k, v in res["bounds"].items()))

    budget = Budget(rule="top_k", k=112, floor=0.5, value="centred", rank="centred")
    runs = {f"bare {dt} B={best_b[dt]}": (lambda dt=dt: models[dt].encode(texts, batch_size=best_b[dt], convert_to_tensor=True)) for dt in dtypes}
    runs.update({f"encoder alone {dt} B={best_o[dt]}": (lambda dt=dt: encoders[dt].encode_tensor(texts, batch_size=best_o[dt])) for dt in dtypes})
    embedders = {}
    for m in ms:
        torch.manual_seed(1)
        heads = StackedHeads(d, m, 8)
        questions = [{"id": f"q{i}", "text": f"question {i}?"} for i in range(m)]
        for dt in dtypes:
            enc = Encoder(st_dir, models[dt], "torch-float32" if dt == "float32" else "torch-float16", a.device)
            model = InterpretableEmbedder(st_dir, questions, heads, device=a.device, encoder=enc, budget=budget,
                                          mean=np.full(m, 0.3, dtype=np.float32))
            embedders[(m, dt)] = model
            res[f"active_per_text_m{m}_{dt}"] = model.encode(texts[:64], output="sparse", progress=False).nnz / min(64, len(texts))
            for out in ("packed", "sparse"):
                name = f"encode m={m} {'bits' if out == 'packed' else out} encoder {dt}"
                runs[name] = lambda model=model, out=out, dt=dt: model.encode(texts, output=out, batch_size=best_b[dt], progress=False)

    # checks: the budget on the device equals the numpy reference on the same probabilities; bits the float16 encoder flips
    from cqg_ray.mbqa import budget_torch
    from cqg_ray.mbqa.budget import active_mask, sparse_budget

    big = max(ms)
    ref = embedders[(big, "float32")]
    sample = texts[: min(len(texts), 2048)]
    P = ref.encode(sample, output="probs", progress=False)
    Pt, mean_t = torch.from_numpy(P).to(a.device), torch.full((big,), 0.3, device=a.device)
    mask = active_mask(P, budget, ref.mean)
    same_bits = np.array_equal(budget_torch.join_parts([budget_torch.output_part(Pt, "bits", budget, mean_t)], "bits", big), mask.view(np.uint8))
    got, want = budget_torch.join_parts([budget_torch.output_part(Pt, "sparse", budget, mean_t)], "sparse", big), sparse_budget(P, budget, ref.mean)
    same_sparse = bool(np.array_equal(got.indices, want.indices) and np.array_equal(got.indptr, want.indptr) and np.array_equal(got.data, want.data))
    print(f"\nthe budget on {a.device} equals the numpy reference on the same probabilities: bits {same_bits}, sparse {same_sparse}")
    res.update(device_budget_equals_numpy_bits=bool(same_bits), device_budget_equals_numpy_sparse=same_sparse)
    if cuda:
        half = embedders[(big, "float16")].encode(sample, output="bits", progress=False)
        flipped = float((half != mask.view(np.uint8)).mean())
        print(f"float16 encoder: {flipped:.4%} of the bits of {len(sample)} texts flipped against float32 (m={big}, same heads)")
        res["fp16_encoder_bits_flipped"] = flipped

    # 3. the embed stage's work, per unit, as its actor does it
    from cqg_ray.embed import EmbedUnits
    import pyarrow as pa

    model_dir = work / "model"
    embedders[(big, "float32")].save(str(model_dir))
    unit = EmbedUnits(str(model_dir), str(work / "out"), "sparse", budget.to_dict(), best_b["float32"], os.cpu_count() or 1, backend="torch-float32")
    unit.model = embedders[(big, "float32")]  # the same heads and encoder object as the encode runs

    def stage_units():
        for i in range(0, len(texts), a.unit_rows):
            chunk = texts[i : i + a.unit_rows]
            unit.write_unit(f"emb-{i:09d}.parquet", pa.array([str(j) for j in range(i, i + len(chunk))]), chunk)

    runs[f"embed stage units, m={big} sparse"] = stage_units

    times: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, float | None] = {}
    whole = texts
    texts = whole[: min(len(whole), 4096)]  # warm-up on a slice (the runs read `texts` when called)
    for fn in runs.values():
        fn()
    texts = whole
    for r in range(a.repeats):
        for name, fn in runs.items():
            if cuda and r == 0:
                torch.cuda.reset_peak_memory_stats()
            times[name].append(timed(fn, sync))
            if r == 0:
                peaks[name] = peak_gib()  # each run's own peak device memory
    rate = {name: len(texts) / statistics.median(t) for name, t in times.items()}
    bare_best = max(v for k, v in rate.items() if k.startswith("bare"))
    print(f"\ninterleaved, median of {a.repeats} ({len(texts)} texts; budget {budget.name}, fixed mean 0.3: 112 active a text):")
    print(f"  {'run':<44}{'texts/s':>10}{'/ best bare':>12}{'peak GPU GiB':>14}")
    for name in runs:
        print(f"  {name:<44}{rate[name]:>10,.0f}{rate[name] / bare_best:>12.3f}{peaks[name] if peaks[name] is not None else '-':>14}")
        res[name] = {"texts_per_s": rate[name], "vs_best_bare": rate[name] / bare_best, "peak_gpu_gib": peaks[name]}
    sparse_best = max(v for k, v in rate.items() if k.startswith(f"encode m={big} sparse"))
    bits_best = max(v for k, v in rate.items() if k.startswith(f"encode m={big} bits"))
    alone_best = max(v for k, v in rate.items() if k.startswith("encoder alone"))
    res.update(best_bare=bare_best, batch=best_b, bits_vs_bare=bits_best / bare_best, sparse_vs_bare=sparse_best / bare_best,
               overlap_vs_bare=alone_best / bare_best)

    if not a.skip_stage:
        try:
            import ray
        except ImportError:
            print("\nthe whole embed stage: not run (Ray is not installed here)")
        else:
            print("\nthe whole `cqg-ray embed` stage, once each (Ray started before; the actors' start-up included):")
            try:  # a machine where Ray does not start still gives the figures above (one lent call may be all there is)
                ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
                for mode in ("off", "on"):
                    stage_rate = whole_stage(texts, model_dir, work, mode)
                    what = "the actors tokenize" if mode == "off" else "a CPU stage tokenizes"
                    print(f"  tokenize_stage={mode} ({what}): {stage_rate:,.0f} texts/s, {stage_rate / bare_best:.3f} of the best bare")
                    res[f"embed_stage_tokenize_{mode}_texts_per_s"] = stage_rate
            except Exception as e:
                print(f"  failed: {type(e).__name__}: {e}")
                res["embed_stage_error"] = f"{type(e).__name__}: {e}"
            finally:
                ray.shutdown()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res["peak_rss_gib"] = round(rss, 2)
    print(f"\npeak RSS {rss:.2f} GiB")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    print(f"gpu_embed_overlap_vs_bare: {alone_best / bare_best:.3f}")
    if "embed_stage_tokenize_on_texts_per_s" in res:
        auto = "on" if a.device.startswith("cuda") else "off"  # what tokenize_stage=auto runs on this device
        print(f"gpu_embed_stage_vs_bare: {res[f'embed_stage_tokenize_{auto}_texts_per_s'] / bare_best:.3f}")
    print(f"gpu_embed_m{big}_bits_vs_bare: {bits_best / bare_best:.3f}")
    print(f"gpu_embed_m{big}_sparse_vs_bare: {sparse_best / bare_best:.3f}")


def bounds(enc, texts: list[str], b: int, sync) -> dict[str, float]:
    """Texts/s of each part of the encoder's loop alone, in one thread at batch size b: tokenizing (`TextTokenizer`, to
    int64 arrays; also on 4 threads), and the model on inputs already on the device (forward and pooling)."""
    import numpy as np
    import torch

    tok, dev = enc._ahead_tokenizer(), enc.st.device
    order = np.argsort([-len(t) for t in texts])
    groups = [[texts[j] for j in order[i : i + b]] for i in range(0, len(texts), b)]
    t0 = time.perf_counter()
    arrays = [tok(g) for g in groups]
    tokenize = len(texts) / (time.perf_counter() - t0)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # whether more tokenizing threads would scale (the arrays are built under the GIL)
        t0 = time.perf_counter()
        list(pool.map(tok, groups))
        tokenize4 = len(texts) / (time.perf_counter() - t0)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc._input_keys()]
    inputs = [{k: torch.from_numpy(x[k]).to(dev) for k in keys} for x in arrays]

    def forward():
        with torch.inference_mode():
            for f in inputs:
                enc.st(dict(f))["sentence_embedding"]

    return {"tokenize": tokenize, "tokenize_4_threads": tokenize4, "model": len(texts) / timed(forward, sync)}


def whole_stage(texts: list[str], model_dir: Path, work: Path, tokenize_stage: str) -> float:
    """Texts/s of `cqg_ray.embed.embed` over the texts written as one JSONL file, with or without its CPU tokenizing stage."""
    from cqg_ray.config import EmbedConfig
    from cqg_ray.embed import embed

    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    t0 = time.perf_counter()
    embed(str(model_dir), [str(corpus)], str(work / f"stage-{tokenize_stage}"), EmbedConfig(output="sparse", tokenize_stage=tokenize_stage),
          progress=False)
    return len(texts) / (time.perf_counter() - t0)


if __name__ == "__main__":
    main()
