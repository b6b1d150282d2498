"""The encoder's exported backends (onnx, onnx-int8, openvino): the export, the machine-wide cache, the runners, and
the saved fast tokenizer that lets a cached backend load without sentence-transformers (``cqg_ray.encoder`` uses them).

    folder = cache_dir(path)                         # ~/.cache/cqg-ray/encoders/<name>-<hash of the encoder folder>/
    model_file = exported_model(st, path, "onnx")    # exported once per machine, checked by sha256, under a file lock
    run = _runner("openvino", model_file, threads)   # (int64 inputs) -> (b, d) float32
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import warnings
import weakref

import numpy as np

from cqg_ray.long_texts import cut_rule, settled, shortened

log = logging.getLogger("cqg_ray")

EXPORTED = {"onnx": "model.onnx", "onnx-int8": "model-int8.onnx", "openvino": "model.onnx"}
CACHE_FORMAT = 2  # bump when the export changes, so old caches are not reused


class TextTokenizer:
    """A sentence-transformers model's fast (Rust) tokenizer on its own, from the `tokenizers` package: truncation at
    max_seq_length (longest first) and padding to the longest text of a call, as sentence-transformers tokenises.
    Saved beside an exported model (`save_tokenizer`, which checks it against the model's own tokens). A text over
    max_seq_length * 32 characters is tokenized from a prefix that gives the same tokens, where the tokenizer's kind
    lets that be shown (`cqg_ray.long_texts`), so a huge text costs about what a normal one does."""

    def __init__(self, spec: str, max_seq_length: int, pad_id: int, pad_token: str, padding_side: str = "right"):
        from tokenizers import Tokenizer

        self._pad = {"pad_id": int(pad_id), "pad_token": pad_token, "direction": padding_side}
        self._spec = spec
        self._tok = Tokenizer.from_str(spec)  # set up once; encode_batch never changes it, so threads may share it
        self._cut = cut_rule(spec)  # None: every text tokenized whole
        self.max_seq_length = max_seq_length

    def spec(self) -> tuple[str, dict]:
        """(spec, settings): what `TextTokenizer(spec, **settings)` needs to give the same tokens in another process."""
        return self._spec, {"max_seq_length": self._max, "pad_id": self._pad["pad_id"], "pad_token": self._pad["pad_token"],
                            "padding_side": self._pad["direction"]}

    @property
    def max_seq_length(self) -> int:
        return self._max

    @max_seq_length.setter
    def max_seq_length(self, n: int) -> None:
        self._max = int(n)
        self._tok.enable_truncation(max_length=self._max, strategy="longest_first")
        self._tok.enable_padding(**self._pad)

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        enc = settled(list(texts), self._max, self._cut, self._tok.encode_batch)[1]
        return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}

    def count(self, texts: list[str]) -> int:
        return int(self(texts)["attention_mask"].sum())

    def shortened(self, texts: list[str]) -> list[str]:
        """``texts`` with each huge one replaced by the prefix these tokens come from (`long_texts.shortened`): for
        the tokenizer this one was checked against (sentence-transformers'), which then reads a prefix too."""
        return shortened(list(texts), self._max, self._cut, self._tok.encode_batch)


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


TOKENIZER_FILE = "tokenizer.json"
# texts on which a saved tokenizer must give the model's own tokens: empty, spaces, accents, CJK, emoji, a long text
TOKENIZER_CHECK = ["", "  leading and trailing spaces  ", "Tabs\tand\nnew lines", "Ünïcödé, 中文 and 😀 emoji",
                   "A short sentence.", "word " * 600]


def checked_tokenizer(st) -> tuple[str, dict] | None:
    """The model's fast tokenizer as (spec, settings) for `TextTokenizer`, when it gives sentence-transformers' own
    tokens on `TOKENIZER_CHECK` (the keys the model reads, equal); None otherwise."""
    tok = st.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or tok.pad_token is None or not st.max_seq_length:
        return None
    settings = {"max_seq_length": int(st.max_seq_length), "pad_id": int(tok.pad_token_id), "pad_token": tok.pad_token,
                "padding_side": tok.padding_side}
    spec = backend.to_str()
    mine = TextTokenizer(spec, **settings)(TOKENIZER_CHECK)
    theirs = _st_inputs(st, TOKENIZER_CHECK)
    if any(k not in mine or not np.array_equal(mine[k], v) for k, v in theirs.items()):
        return None
    return spec, settings


def save_tokenizer(st, folder: str) -> bool:
    """Save the model's fast tokenizer and its settings into an encoder's cache folder (under its lock), so later loads
    need no sentence-transformers; only when `TextTokenizer` gives the model's own tokens on `TOKENIZER_CHECK`.
    Returns whether it was saved."""
    checked = checked_tokenizer(st)
    if checked is None:
        log.info("encoder %s: its tokenizer alone does not reproduce sentence-transformers' tokens; loads keep using the library", folder)
        return False
    spec, settings = checked
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
def encoders_root() -> str:
    """Where exported encoders live: the machine cache's encoders/ (``cqg_ray.cache``)."""
    from cqg_ray.cache import cache_root

    return str(cache_root() / "encoders")


def cache_dir(path: str) -> str:
    """The cache folder of one encoder: its name plus a hash of its folder's files (names, sizes, mtimes)."""
    h = hashlib.sha256(f"format {CACHE_FORMAT}\n{os.path.abspath(path) if os.path.isdir(path) else path}\n".encode())
    if os.path.isdir(path):
        for root, _, files in sorted(os.walk(path)):
            for f in sorted(files):
                st = os.stat(os.path.join(root, f))
                h.update(f"{os.path.relpath(os.path.join(root, f), path)} {st.st_size} {st.st_mtime_ns}\n".encode())
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in os.path.basename(os.path.normpath(path)))[:60]
    return os.path.join(encoders_root(), f"{slug}-{h.hexdigest()[:16]}")


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
# The runtime cache (compiled kernels per input shape, 5,000 shapes by default) held a long-lived process's memory
# growing with every new (batch, length) pair: a Serve replica went from 0.9 to 3.2 GB over ~7,000 requests. 256 shapes
# keep it bounded at the same speed (+0.24 GB against +1.27 GB over 1,600 calls of many shapes; `python
# bench/encoder_shapes.py`, docs/performance.md).
OPENVINO_CPU_CONFIG = {"PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False, "CPU_RUNTIME_CACHE_CAPACITY": 256}


def openvino_config(threads: int) -> dict:
    """OpenVINO's CPU settings for `threads` threads. OpenVINO chooses its precision from the CPU itself (bfloat16
    where native, within auto's tolerance: `encoder.pick_backend`); under ``CQG_RAY_MAX_CPU_ISA=avx2`` on such a CPU it
    is asked for float32, as it computes on an AVX2 CPU (its bfloat16 kernels do not exist under
    ``ONEDNN_MAX_CPU_ISA=AVX2``). Elsewhere its own choice stands (f16 on ARM with fp16, for one)."""
    from cqg_ray.hardware import cpu_flags, pick_dtype

    capped = pick_dtype() != pick_dtype(cpu_flags(capped=False))
    return OPENVINO_CPU_CONFIG | {"INFERENCE_NUM_THREADS": threads} | ({"INFERENCE_PRECISION_HINT": "f32"} if capped else {})


class Runner:
    """An exported model, loaded: (feeds: dict of int64 arrays) -> (b, d) float32. Safe to call from several threads
    (an OpenVINO InferRequest is not: callers take turns on it; an onnxruntime session is). `close()` releases the
    native session; live runners are also closed by an atexit hook, so OpenVINO's and onnxruntime's objects (and
    their thread pools) are never left to the garbage collector of an interpreter that is shutting down."""

    def __init__(self, backend: str, model_file: str, threads: int):
        self.threads = threads
        self.backend, self.model_file, self._lock = backend, model_file, threading.Lock()
        try:
            if backend == "openvino":
                import openvino as ov

                self._compiled = ov.Core().compile_model(model_file, "CPU", openvino_config(threads))
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
