#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (slow end-to-end tests included; `-m "not slow"` for the quick ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
