"""What an offline GPU machine with torch and sentence-transformers lacks to run `bench/gpu_embed.py` whole, in one folder.

    python scripts/gpu_pack.py                       # writes .gpu/ for a Python 3.12 machine and prints its command
    python scripts/gpu_pack.py --python 3.11 --out /tmp/pack --texts 2000   # for this machine's Python, to check it here

The GPU machines this project is lent start from an image with torch, sentence-transformers, pyarrow and pandas, reach
no package index, and take at most 64 MiB with each command (the working tree included). Ray's wheel is 79 MB, so
Ray's stages were never timed there. The folder holds:
- ``site.tar.xz``: Ray (this environment's version, the target Python's wheel) and the few packages it and cqg_ray
  import that the image lacks (``MISSING``), unpacked, without what no stage here runs (``PRUNE``: Java, RLlib,
  Serve, the LLM module, the dashboard's web page) and with the debug symbols stripped from Ray's binaries; ~26 MiB;
- ``minilm/``: the bundled MiniLM folder's config and tokenizer, without weights (the bench makes random ones);
- ``texts.jsonl.gz``: the first --texts texts of the shared corpus.
On the machine: ``tar xJf .gpu/site.tar.xz -C /tmp/site`` and ``PYTHONPATH=/tmp/site:$PWD`` (Ray's workers import
cqg_ray from the checkout); the command printed at the end does that and runs the bench. Needs ``strip``
(binutils) for the size; without it the pack is ~40 MB bigger.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "sentences.jsonl.gz"
# distributions that Ray, Ray Data and cqg_ray's embed stage import and the GPU image does not hold (its package list:
# the device tool's KINDS.md); each is packed at the version installed here
MISSING = ("ray", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "jsonschema",
           "jsonschema-specifications", "referencing", "rpds-py")
# top-level paths inside the unpacked wheels that no stage of bench/gpu_embed.py imports
PRUNE = ("ray/jars", "ray/rllib", "ray/serve", "ray/llm", "ray/dashboard/client", "ray/tests")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux1_x86_64")
WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.onnx", "openvino_model.bin", "openvino_model.xml")


def pruned(path: str) -> bool:
    """Whether a path inside the unpacked wheels is left out: under a PRUNE folder, a source map, or a test folder."""
    return any(path == p or path.startswith(p + "/") for p in PRUNE) or path.endswith(".js.map") or "/tests/" in f"/{path}"


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def download(names: tuple[str, ...], python: str, dest: Path) -> list[Path]:
    """The wheels of ``names`` at the versions installed here, for CPython ``python`` on x86-64 Linux."""
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in names]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    python, "--implementation", "cp", *platforms, "-d", str(dest), *pins], check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheels: list[Path], site: Path, strip_over: int = 1 << 20) -> tuple[int, int]:
    """The wheels' files, less the pruned ones, into site; ELF files over strip_over bytes stripped of debug symbols,
    every ELF file executable. (files kept, bytes saved)."""
    kept = 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.is_dir() and not pruned(info.filename):
                    z.extract(info, site)
                    kept += 1
    saved = 0
    strip = shutil.which("strip")
    for f in site.rglob("*"):
        if not (f.is_file() and is_elf(f)):
            continue
        before = f.stat().st_size
        if strip and before > strip_over:
            subprocess.run([strip, "--strip-unneeded", str(f)], check=True)
            saved += before - f.stat().st_size
        f.chmod(0o755)  # Ray's binaries must stay executable (a zip keeps no mode)
    return kept, saved


def encoder_folder(dest: Path) -> None:
    """The bundled MiniLM folder without its weights (and without exports left in it)."""
    sys.path.insert(0, str(ROOT))
    from cqg_ray.encoder import resolve_encoder_path

    src = Path(resolve_encoder_path("bundled:all-MiniLM-L6-v2"))
    shutil.copytree(src, dest, ignore=lambda d, names: [n for n in names if n in WEIGHTS or n.startswith(".")])


def texts_file(n: int, dest: Path) -> int:
    """The first n non-empty texts of the shared corpus as JSONL.gz; how many there were."""
    count = 0
    with gzip.open(CORPUS, "rt", encoding="utf-8") as src, gzip.open(dest, "wt", encoding="utf-8") as out:
        for line in src:
            text = json.loads(line).get("text", "").strip()
            if text:
                out.write(json.dumps({"text": text}) + "\n")
                count += 1
            if count == n:
                break
    return count


def tracked_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--out", default=str(ROOT / ".gpu"), help="the folder to write (default .gpu/, which git ignores)")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12, the image's)")
    ap.add_argument("--texts", type=int, default=50_000, help="texts of the shared corpus to carry (default 50,000)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(MISSING, a.python, Path(tmp) / "wheels")
        site = Path(tmp) / "site"
        kept, saved = unpack(wheels, site)
        print(f"{len(wheels)} wheels ({sum(w.stat().st_size for w in wheels) / 1e6:.1f} MB): {kept:,} files kept, "
              f"{saved / 1e6:.1f} MB of debug symbols stripped")
        with tarfile.open(out / "site.tar.xz", "w:xz") as tar:
            tar.add(site, arcname=".")
    shutil.rmtree(out / "minilm", ignore_errors=True)
    encoder_folder(out / "minilm")
    n = texts_file(a.texts, out / "texts.jsonl.gz") if CORPUS.exists() else 0
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    tree = tracked_bytes()
    print(f"{out}: {size / 2**20:.1f} MiB (site.tar.xz {(out / 'site.tar.xz').stat().st_size / 2**20:.1f}, {n:,} texts); "
          f"with the tracked files {(size + tree) / 2**20:.1f} MiB of the 64 MiB a call carries")
    rel = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print("\nthe call (carry: [\"%s\"]):" % rel)
    print(f"  mkdir -p /tmp/site && tar xJf {rel}/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && "
          f"python3 bench/gpu_embed.py --model-dir {rel}/minilm --texts-file {rel}/texts.jsonl.gz --texts {n or 50000} "
          "--json $OUT/gpu_embed.json 2>&1 | tee $OUT/gpu_embed.log")


if __name__ == "__main__":
    main()
