"""scripts/gpu_pack.py's parts that need no package index: what is left out, and the wheels unpacked and stripped."""

import importlib.util
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_pack.py"
spec = importlib.util.spec_from_file_location("gpu_pack", SCRIPT)
gpu_pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_pack)


def test_what_no_stage_imports_is_left_out():
    keep = ["ray/__init__.py", "ray/data/dataset.py", "ray/train/__init__.py", "ray/tune/__init__.py", "ray/_raylet.so",
            "ray/core/src/ray/raylet/raylet", "ray/dashboard/modules/job/job_head.py", "ray/serve_helpers.py",
            "pydantic/main.py", "rpds/__init__.py", "ray-2.60.0.dist-info/METADATA"]
    drop = ["ray/jars/ray_dist.jar", "ray/rllib/algorithms/ppo/ppo.py", "ray/serve/api.py", "ray/llm/__init__.py",
            "ray/dashboard/client/build/index.html", "ray/tests/test_basic.py", "ray/data/tests/test_map.py",
            "ray/dashboard/main.js.map", "ray/serve"]
    assert [p for p in keep if gpu_pack.pruned(p)] == []
    assert [p for p in drop if not gpu_pack.pruned(p)] == []


def test_wheels_unpack_without_the_pruned_files_and_their_binaries_stripped_still_run(tmp_path):
    strip = shutil.which("strip")
    true = shutil.which("true")
    if strip is None or true is None:
        pytest.skip("needs binutils' strip and a `true` binary")
    binary = Path(true).resolve()
    wheel = tmp_path / "ray-0-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("ray/__init__.py", "x = 1\n")
        z.writestr("ray/rllib/a.py", "y = 2\n")
        z.writestr("ray/dashboard/client/build/static/main.js", "z\n")
        z.write(binary, "ray/core/src/ray/raylet/raylet")  # zip keeps no mode: unpack must make it executable again
    site = tmp_path / "site"
    kept, saved = gpu_pack.unpack([wheel], site, strip_over=0)
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert (kept, files) == (2, ["ray/__init__.py", "ray/core/src/ray/raylet/raylet"])
    raylet = site / "ray/core/src/ray/raylet/raylet"
    assert gpu_pack.is_elf(raylet) and not gpu_pack.is_elf(site / "ray/__init__.py")
    assert os.access(raylet, os.X_OK) and saved == binary.stat().st_size - raylet.stat().st_size >= 0
    assert subprocess.run([str(raylet)]).returncode == 0  # stripped, it still runs
