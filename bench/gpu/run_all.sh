#!/usr/bin/env bash
# One device run of every bench/gpu part, each under its own time cap, JSON into $OUT as it
# goes (a part killed by its cap leaves what it finished). SMALL=1: tiny CPU smoke run.
# SET=followup: the second, shorter run (copy_bench.followup, stack_bench.followup_plan).
# Usage (device): bash bench/gpu/run_all.sh  -> $OUT/{env.txt,copy.json,stack.json,*.log}
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
PY=${PY:-python3}
SET=${SET:-main}
FLAGS="--set $SET"
[ "${SMALL:-0}" = 1 ] && FLAGS="$FLAGS --small --cpu"
mkdir -p "$OUT"
if [ "$SET" = main ]; then
  SUF=""; CAPS=(170 140 350 330)
  { date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -30
    $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
  } > "$OUT/env.txt" 2>&1
else
  SUF="_$SET"; CAPS=(60 45 150 140)
fi
timeout "${CAPS[0]}" $PY "$HERE/copy_bench.py" $FLAGS --budget-s "${CAPS[1]}" \
  --out "$OUT/copy$SUF.json" > "$OUT/copy$SUF.log" 2>&1
echo "copy_bench rc=$?"
timeout "${CAPS[2]}" $PY "$HERE/stack_bench.py" $FLAGS --budget-s "${CAPS[3]}" \
  --out "$OUT/stack$SUF.json" > "$OUT/stack$SUF.log" 2>&1
echo "stack_bench rc=$?"
tail -n 3 "$OUT/copy$SUF.log" "$OUT/stack$SUF.log"
$PY "$HERE/summary.py" "$OUT/copy$SUF.json" "$OUT/stack$SUF.json"
