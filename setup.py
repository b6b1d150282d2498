"""The wheel carries the shipped models: ``models/<name>/`` of the checkout becomes ``cqg_ray/models/<name>/`` in the
build, where ``InterpretableEmbedder.load("<name>")`` finds it after ``pip install`` (everything else is in
pyproject.toml; MANIFEST.in puts models/ in the sdist)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class build_py_with_models(build_py):
    def run(self):
        super().run()
        src = ROOT / "models"
        if not src.is_dir():
            return
        for f in sorted(src.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                dest = Path(self.build_lib) / "cqg_ray" / "models" / f.relative_to(src)
                self.mkpath(str(dest.parent))
                self.copy_file(str(f), str(dest))


setup(cmdclass={"build_py": build_py_with_models})
