#!/usr/bin/env bash
# One device run of every bench/gpu part, each under its own time cap, JSON into $OUT as it
# goes (a part killed by its cap leaves what it finished). SMALL=1: tiny CPU smoke run.
# Usage (device): bash bench/gpu/run_all.sh     -> $OUT/{env.txt,copy.json,stack.json,*.log}
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
PY=${PY:-python3}
FLAGS=""
[ "${SMALL:-0}" = 1 ] && FLAGS="--small --cpu"
mkdir -p "$OUT"
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -30;
  $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
} > "$OUT/env.txt" 2>&1
timeout 170 $PY "$HERE/copy_bench.py" $FLAGS --budget-s 140 --out "$OUT/copy.json" \
  > "$OUT/copy.log" 2>&1
echo "copy_bench rc=$?"
timeout 350 $PY "$HERE/stack_bench.py" $FLAGS --budget-s 330 --out "$OUT/stack.json" \
  > "$OUT/stack.log" 2>&1
echo "stack_bench rc=$?"
tail -n 3 "$OUT/copy.log" "$OUT/stack.log"
$PY "$HERE/summary.py" "$OUT/copy.json" "$OUT/stack.json"
