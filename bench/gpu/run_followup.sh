#!/usr/bin/env bash
# The second, shorter device run (see copy_bench.followup and stack_bench.followup_plan):
# $OUT/{copy_followup,stack_followup}.json. SMALL=1: tiny CPU smoke run.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-out}
PY=${PY:-python3}
FLAGS=""
[ "${SMALL:-0}" = 1 ] && FLAGS="--small --cpu"
mkdir -p "$OUT"
timeout 60 $PY "$HERE/copy_bench.py" $FLAGS --set followup --budget-s 45 \
  --out "$OUT/copy_followup.json" > "$OUT/copy_followup.log" 2>&1
echo "copy_bench rc=$?"
timeout 150 $PY "$HERE/stack_bench.py" $FLAGS --set followup --budget-s 140 \
  --out "$OUT/stack_followup.json" > "$OUT/stack_followup.log" 2>&1
echo "stack_bench rc=$?"
tail -n 3 "$OUT/copy_followup.log" "$OUT/stack_followup.log"
$PY "$HERE/summary.py" "$OUT/copy_followup.json" "$OUT/stack_followup.json"
