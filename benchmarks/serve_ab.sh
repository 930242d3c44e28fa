#!/usr/bin/env bash
# Serving throughput of several variants side by side, interleaved: each
# round starts `troupe serve` once per variant (a binary and config
# overrides), waits for /ready, loads it with `troupe bench --url` at each
# concurrency, and stops it. Compare variants within a round; rounds show
# the machine's noise.
#
#   benchmarks/serve_ab.sh [--model PATH] [--threads N] [--rounds R]
#                          [--concurrency "1 16"] [--requests N1] [--per-client N]
#                          [--prompt-len L] [--prefix-len P] [--output-len O] [--no-stream]
#                          NAME=BINARY[:KEY=VALUE,...] ...
#
#   benchmarks/serve_ab.sh old=/tmp/old/build/troupe:batching.async_scheduling=false \
#                          new=build/troupe
#
# KEY=VALUE pairs are the config's (see configs/default.yaml), given to
# `troupe serve` as --set overrides. --no-stream asks for whole JSON
# responses instead of event streams; --prefix-len starts every prompt with
# the same P tokens (what a prefix cache reuses). Prints one line per
# variant per round: output tokens/s and the median TTFT.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=models/fortune THREADS=2 ROUNDS=3 CONC="1 16" N1=100 PER_CLIENT=20 PROMPT=16 OUTPUT=64
VARIANTS=() BENCH_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --requests) N1=$2; shift 2 ;;
    --per-client) PER_CLIENT=$2; shift 2 ;;
    --prompt-len) PROMPT=$2; shift 2 ;;
    --output-len) OUTPUT=$2; shift 2 ;;
    --no-stream) BENCH_FLAGS+=(--no-stream); shift ;;
    --prefix-len) BENCH_FLAGS+=(--prefix-len "$2"); shift 2 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *=*) VARIANTS+=("$1"); shift ;;
    *) echo "serve_ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#VARIANTS[@]} -ge 1 ] || { echo "serve_ab: name at least one NAME=BINARY variant" >&2; exit 2; }

PORT=$((20000 + RANDOM % 20000))
BENCH=build/troupe
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

for round in $(seq 1 "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    name=${v%%=*}
    rest=${v#*=}
    bin=${rest%%:*}
    sets=()
    if [[ $rest == *:* ]]; then
      IFS=, read -r -a kvs <<<"${rest#*:}"
      for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
    fi
    "$bin" serve --config configs/default.yaml --set "model.path=$MODEL" \
      --set "server.listen=127.0.0.1:$PORT" --set "devices=[{kind: cpu, threads: $THREADS}]" \
      --set logging.level=warn "${sets[@]}" >"$LOG" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
      curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break
      kill -0 "$pid" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
      sleep 0.1
    done
    line="round $round $name"
    for c in $CONC; do
      n=$((c == 1 ? N1 : PER_CLIENT * c))
      out=$("$BENCH" bench --url "http://127.0.0.1:$PORT" --concurrency "$c" --requests "$n" \
        --prompt-len "$PROMPT" --output-len "$OUTPUT" "${BENCH_FLAGS[@]}" 2>&1)
      tps=$(grep -o "[0-9.]* output tokens/s" <<<"$out" | head -1 | cut -d' ' -f1)
      ttft=$(awk '/TTFT ms/ {print $4}' <<<"$out")
      line="$line | c=$c ${tps:-?} tokens/s, TTFT p50 ${ttft:--} ms"
    done
    echo "$line"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
