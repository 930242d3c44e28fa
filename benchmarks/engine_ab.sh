#!/usr/bin/env bash
# Engine speed of several binaries side by side, interleaved: each round runs
# `troupe bench` (engine mode, the same arguments) once per variant, in turn.
# Prints every round's prefill and decode tokens/s with each variant's ratio
# to the first, then the median ratios: compare within a round, read the
# spread across rounds as the machine's noise.
#
#   benchmarks/engine_ab.sh [--rounds R] NAME='BINARY [ARGS]' ... -- BENCH_ARGS...
#
#   benchmarks/engine_ab.sh --rounds 8 old=/tmp/old/build/troupe new=build/troupe -- \
#       --preset 110m --dtype bf16 --threads 2 --batch 1,8 --prompt-len 512 \
#       --decode-tokens 16 --repeats 3
#   benchmarks/engine_ab.sh f32=build/troupe f16='build/troupe --kv-dtype f16' -- ...
#       (a variant's own ARGS go before the shared ones)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=5
VARIANTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *=*) VARIANTS+=("$1"); shift ;;
    *) echo "engine_ab: unknown argument $1 (bench arguments go after --)" >&2; exit 2 ;;
  esac
done
[ ${#VARIANTS[@]} -ge 2 ] || { echo "engine_ab: name at least two NAME=BINARY variants" >&2; exit 2; }

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# One line per measurement: round variant metric tokens/s.
for round in $(seq 1 "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    name=${v%%=*}
    read -r -a cmd <<<"${v#*=}"
    "${cmd[0]}" bench "${cmd[@]:1}" "$@" 2>&1 | awk -v r="$round" -v n="$name" '
      /^prefill/ { print r, n, "prefill", $(NF-1) }
      /^ +[0-9]+ \|/ { print r, n, "decode_b" $1, $3 }' >>"$OUT"
  done
done

awk -v first="${VARIANTS[0]%%=*}" '
  { v[$1, $2, $3] = $4; if (!($3 in seen)) { seen[$3] = 1; metrics[++m] = $3 }
    if (!($2 in named)) { named[$2] = 1; names[++k] = $2 } rounds = $1 }
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END {
    for (r = 1; r <= rounds; r++) {
      line = "round " r ":"
      for (i = 1; i <= m; i++) {
        line = line "  " metrics[i]
        for (j = 1; j <= k; j++) {
          x = v[r, names[j], metrics[i]]
          line = line " " names[j] " " x
          if (names[j] != first && v[r, first, metrics[i]] > 0)
            line = line sprintf(" (%.3fx)", x / v[r, first, metrics[i]])
        }
      }
      print line
    }
    for (j = 1; j <= k; j++) {
      if (names[j] == first) continue
      line = "median " names[j] "/" first ":"
      for (i = 1; i <= m; i++) {
        n = 0
        for (r = 1; r <= rounds; r++)
          if (v[r, first, metrics[i]] > 0) ratio[++n] = v[r, names[j], metrics[i]] / v[r, first, metrics[i]]
        line = line sprintf("  %s %.3fx", metrics[i], median(ratio, n))
      }
      print line
    }
  }' "$OUT"
