#!/bin/bash
# Issue-5 layouts on the 110m preset, one thread per device, in interleaved
# rounds (this machine is shared and noisy: compare within a round).
#   benchmarks/layouts.sh [ROUNDS]
# Prints decode tokens/s at batch 1 and 16, bubble per stage, comm share.
set -euo pipefail
B=${TROUPE:-build/troupe}
for round in $(seq 1 "${1:-3}"); do
  for cfg in "single:" "T2:--tensor 2" "P2groups:--pipeline 2" "P2micro:--pipeline 2 --groups 1"; do
    name=${cfg%%:*}
    # shellcheck disable=SC2086
    "$B" bench --preset 110m --batch 1,16 --prompt-len 64 --threads 1 --repeats 2 ${cfg#*:} --json \
      2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
d = {p["batch"]: p for p in j["decode"]}
row = ["b%d=%.1f bubble=%s comm=%.2f" % (b, d[b]["tokens_per_s"],
       [round(x, 2) for x in d[b].get("bubble_fraction", [])], d[b].get("comm_share", 0))
       for b in (1, 16)]
print(sys.argv[1], sys.argv[2], *row, j.get("stage_layers", ""))' "$name" "$round"
  done
done
