#!/usr/bin/env bash
# The reference build (cqg_ray/configs/reference.yaml), resumable across sessions and machines:
#   1. restores the LLM ledger committed in builds/cqg-minilm-ref/ledger into runs/reference (no finished call is asked again);
#   2. runs `cqg-ray run --config reference` under nice (it takes the CPU that is idle; NICE=0 for a dedicated machine);
#   3. copies the ledger's finished shards back to builds/cqg-minilm-ref/ledger every SAVE_S seconds (default 300) and
#      when it stops (first moving the answers a stopped writer journalled into a shard, once no writer is left), with
#      the questions, labels and the build's stats; commit that folder to carry the build on.
# Extra arguments go to `cqg-ray run` (e.g. --until cqg). Progress: runs/reference/_progress.json, `cqg-ray status runs/reference`.
set -euo pipefail
cd "$(dirname "$0")/.."
run=runs/reference
keep=builds/cqg-minilm-ref
mkdir -p "$run/llm/ledger" "$keep/ledger"
copy_shards() {  # FROM TO: every finished ledger shard FROM has and TO lacks (shards are immutable, written atomically)
  (cd "$1" && find . -name '*.parquet' -print0) | while IFS= read -r -d '' f; do
    [ -e "$2/$f" ] || { mkdir -p "$2/$(dirname "$f")"; cp "$1/$f" "$2/$f.part" && mv "$2/$f.part" "$2/$f"; }
  done
}
save() {
  copy_shards "$run/llm/ledger" "$keep/ledger"
  for f in questions/candidates.parquet questions/questions.parquet questions/stats.json questions/report.md \
           labels/labels.parquet labels/stats.json _progress.json; do
    [ -e "$run/$f" ] && { mkdir -p "$keep/$(dirname "$f")"; cp "$run/$f" "$keep/$f"; }
  done
  echo "[reference-build] $(date -u +%H:%M:%S) saved: $(find "$keep/ledger" -name '*.parquet' | wc -l) ledger shards, $(du -sh "$keep" | cut -f1)"
}
recover() {  # answers a stopped writer had journalled, moved into shards once no writer is left (Ledger.recover)
  for _ in $(seq 60); do pgrep -f "ray::|cqg-ray run --config reference" >/dev/null || break; sleep 1; done
  if pgrep -f "ray::|cqg-ray run --config reference" >/dev/null; then
    echo "[reference-build] a writer is still running: its journals stay for the next run"; return
  fi
  .venv/bin/python - "$run" <<'PY' || true
import os
import sys
from cqg_ray.llm.ledger import Ledger
from cqg_ray.rundir import RunDir
run, folder = RunDir(sys.argv[1]), os.path.join(sys.argv[1], "llm", "ledger")
for stage in sorted(os.listdir(folder)):
    if not os.path.isdir(os.path.join(folder, stage)):
        continue
    n = Ledger(run, stage).recover()
    if n:
        print(f"[reference-build] {stage}: {n} journalled answers moved into a shard")
PY
}
copy_shards "$keep/ledger" "$run/llm/ledger"
( while sleep "${SAVE_S:-300}"; do save; done ) &
saver=$!
trap 'kill $saver 2>/dev/null || true; recover; save' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the machine's choices made as on the AVX2 EPYC the build started on (cqg_ray.hardware), so that every machine
# recomputes the same clusters: OpenVINO's encoder computes in float32 there, in bfloat16 where that is native, and
# the generation prompts' keys hold the clusters' texts (a Zen 4 so found all 400 and 13,888 probes, 2026-11-28)
export CQG_RAY_MAX_CPU_ISA=${CQG_RAY_MAX_CPU_ISA-avx2}
nice -n "${NICE:-15}" .venv/bin/cqg-ray run --config reference "$@"
