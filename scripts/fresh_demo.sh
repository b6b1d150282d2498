#!/usr/bin/env bash
# Times what a new user meets, on a machine that is not new: set-up, then the demo, from a clone of HEAD with empty
# caches (pip's, cqg-ray's, Hugging Face's) under DIR, beside a link to ../shared. Only the operating system's own
# packages and page cache are not fresh. Prints each part's wall time and peak RSS (GNU time), as the README's demo
# table gives them; the logs stay in DIR (removed first, so each run starts empty).
#   bash scripts/fresh_demo.sh [DIR] [-- demo arguments]     # DIR defaults to /tmp/cqg-ray-fresh
#   eval $(.venv/bin/python -m cqg_ray.hardware --avx2-env); bash scripts/fresh_demo.sh   # as an AVX2-only CPU would
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/cqg-ray-fresh
case "${1:-}" in -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
if [ $# -gt 0 ] && [ "$1" != -- ]; then dir=$1; shift; fi
[ "${1:-}" != -- ] || shift
case "$dir" in /|"$HOME"|"$root"|"$root"/*) echo "scripts/fresh_demo.sh: refusing DIR=$dir" >&2; exit 2 ;; esac
rm -rf "$dir" && mkdir -p "$dir"
git clone -q --no-hardlinks "$root" "$dir/repo"
ln -s "$(cd "$root/../shared" && pwd)" "$dir/shared"
export XDG_CACHE_HOME="$dir/cache" PIP_CACHE_DIR="$dir/cache/pip" HF_HOME="$dir/cache/huggingface"
unset CQG_RAY_CACHE CQG_RAY_VENV
cd "$dir/repo"
echo "[fresh] $(git log -1 --format='%h %s' | cut -c1-80) in $dir/repo, caches under $XDG_CACHE_HOME"
timed() {  # NAME COMMAND...: runs it with GNU time into DIR/NAME.log, prints its wall time and peak RSS
  local name=$1; shift
  /usr/bin/time -v -o "$dir/$name.time" "$@" > "$dir/$name.log" 2>&1 || { tail -20 "$dir/$name.log"; exit 1; }
  local wall rss
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$dir/$name.time")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$dir/$name.time")
  echo "[fresh] $name: $wall, peak RSS $(awk -v k="$rss" 'BEGIN { printf "%.1f GB", k / 1e6 }')"
}
timed setup bash scripts/setup.sh
timed demo bash scripts/demo.sh --set run_dir=runs/fresh "$@"
grep -E "^demo sizing: [0-9]|^(questions|labels|model) +done" "$dir/demo.log" | cut -c1-240 || true
grep -m1 -A3 "^STS: " "$dir/demo.log" | grep "^CQG-MBQA" | sed 's/  */ /; s/^/STS-B: /' || true
