"""The wheel: built from the package's own files, installed into a fresh venv outside the checkout, run from there.

The venv is made from the base interpreter, the wheel installed with ``--no-deps`` (no network here), and the
dependencies reach it through a ``.pth`` line naming the test venv's site-packages: a folder named in a ``.pth`` file is
put on sys.path without running the ``.pth`` files inside it, so the checkout's editable install stays out. Every
command runs in a temporary folder with no PYTHONPATH, and each test checks that cqg_ray came from the wheel.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of pyproject.toml, setup.py, MANIFEST.in, README.md, cqg_ray/ and models/ only, so nothing else
    in the checkout can leak in."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("cqg_ray", "models"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    try:
        import build.__main__  # noqa: F401  (the package, not a build/ folder left by an earlier pip wheel)

        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)]
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, cwd=src)
    (whl,) = out.glob("cqg_ray-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A venv of the base interpreter with the wheel installed and this environment's site-packages on its path."""
    home = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(home)], check=True)
    py = home / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check", "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    site = Path(run(home, str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_cqg_ray_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return home


def run(home: Path, *cmd: str) -> subprocess.CompletedProcess:
    """A command in a fresh folder outside the checkout, without PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cwd = home.parent / "work"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=True)


def test_the_wheel_holds_the_configs_and_the_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in [*(ROOT / "cqg_ray" / "configs").glob("*.yaml"), *(ROOT / "cqg_ray" / "serve" / "static").iterdir()]:
        assert f.relative_to(ROOT).as_posix() in names
    assert {"cqg_ray/configs/demo.yaml", "cqg_ray/configs/paper.yaml", "cqg_ray/serve/static/index.html"} <= names
    assert not any(n.startswith(("tests/", "configs/", "scripts/")) for n in names)


def test_the_wheel_carries_the_shipped_model_under_50_mb(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [f for f in (ROOT / "models").rglob("*") if f.is_file()]
    assert shipped and {"cqg_ray/models/" + f.relative_to(ROOT / "models").as_posix() for f in shipped} <= names
    assert wheel.stat().st_size < 50e6


def test_the_shipped_model_loads_by_name_from_the_wheel(venv):
    """``InterpretableEmbedder.load("cqg-minilm-ref")`` in a folder with no models/, from the installed wheel: the
    folder it loads is the wheel's, and its sparse output equals the checkout's."""
    import numpy as np

    from cqg_ray import InterpretableEmbedder

    texts = ["A man is playing a guitar.", "The central bank raised interest rates."]
    code = ("import json, cqg_ray; from cqg_ray import InterpretableEmbedder; from cqg_ray.mbqa.embedder import resolve_model; "
            "m = InterpretableEmbedder.load('cqg-minilm-ref'); print(resolve_model('cqg-minilm-ref')); "
            f"s = m.encode({texts!r}, output='sparse'); print(json.dumps([s.indices.tolist(), s.indptr.tolist(), s.data.tolist()]))")
    where, out = run(venv, str(venv / "bin" / "python"), "-c", code).stdout.strip().splitlines()[-2:]
    assert where.startswith(str(venv)) and where.endswith("cqg_ray/models/cqg-minilm-ref")
    here = InterpretableEmbedder.load(str(ROOT / "models" / "cqg-minilm-ref")).encode(texts, output="sparse")
    indices, indptr, data = __import__("json").loads(out)
    assert indices == here.indices.tolist() and indptr == here.indptr.tolist()
    assert np.allclose(data, here.data, atol=1e-6)


def test_installed_package_comes_from_the_wheel_and_finds_its_configs(venv):
    from cqg_ray.config import load_config
    from cqg_ray.configs import packaged

    pipeline = sorted(set(packaged()) - {"serve"})
    code = ("import cqg_ray, cqg_ray.configs as c; from cqg_ray.config import load_config; "
            "print(cqg_ray.__file__); print(c.config_file('demo')); "
            f"[print(load_config(n).model_dump_json()) for n in {pipeline!r}]")
    pkg, demo, *configs = run(venv, str(venv / "bin" / "python"), "-c", code).stdout.splitlines()
    assert pkg.startswith(str(venv)) and demo.startswith(str(venv)) and demo.endswith("cqg_ray/configs/demo.yaml")
    assert not pkg.startswith(str(ROOT))
    assert configs == [load_config(n).model_dump_json() for n in pipeline]  # the wheel's configs read as the checkout's


def test_cli_runs_from_the_wheel(venv):
    out = run(venv, str(venv / "bin" / "cqg-ray"), "--help").stdout
    for command in ("run", "status", "demo", "serve", "embed"):
        assert command in out
    demo = " ".join(run(venv, str(venv / "bin" / "cqg-ray"), "demo", "--help").stdout.split())
    assert "--config CONFIG" in demo and "(default: demo, i.e. cqg_ray/configs/demo.yaml)" in demo


def test_the_declared_dependencies_are_the_installed_ones(venv):
    """Every requirement of the wheel and of its cpu extra (plots and eval within it) holds in the environment the
    tests run in: the lower bounds in pyproject.toml are versions that are tested."""
    code = """
import importlib.metadata as md
from packaging.requirements import Requirement
bad = []
for r in map(Requirement, md.distribution("cqg-ray").requires):
    wanted = r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("cpu", "plots", "eval"))
    if r.name == "cqg-ray" or not wanted:
        continue
    try:
        v = md.version(r.name)
    except md.PackageNotFoundError:
        bad.append(f"{r} (not installed)")
        continue
    if not r.specifier.contains(v, prereleases=True):
        bad.append(f"{r} (installed {v})")
print("\\n".join(bad))
"""
    assert run(venv, str(venv / "bin" / "python"), "-c", code).stdout.strip() == ""
