#!/usr/bin/env bash
# Set up if needed, then run the embedded demo (local Ray, CPU, bundled encoder and LLM, a sample of ../shared/data).
# Interrupt it any time: running it again resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/cqg-ray demo "$@"
