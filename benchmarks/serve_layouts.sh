#!/bin/bash
# Serving throughput of 1x1, T=2, P=2 and 2 replicas (one thread per device)
# at 1 and 16 clients, in interleaved rounds.
#   benchmarks/serve_layouts.sh MODEL_DIR [ROUNDS]
# MODEL_DIR e.g. from: build/troupe synth-model --preset 110m --dtype f32 --out /tmp/m110
set -euo pipefail
B=${TROUPE:-build/troupe}
MODEL=${1:?model directory}
port=18300
for round in $(seq 1 "${2:-2}"); do
  for cfg in "1x1:" "T2:parallel.tensor=2" "P2:parallel.pipeline=2" "R2:parallel.replicas=2"; do
    name=${cfg%%:*}
    port=$((port + 1))
    extra=()
    [ -n "${cfg#*:}" ] && extra=(--set "${cfg#*:}")
    "$B" serve --set "model.path=$MODEL" --set kv_cache.blocks=1024 --set logging.level=warn \
      --set 'devices=[{kind: cpu, threads: 1}]' "${extra[@]}" --listen "127.0.0.1:$port" 2>/dev/null &
    pid=$!
    for _ in $(seq 1 240); do
      curl -s "127.0.0.1:$port/ready" | grep -q ready && break
      sleep 0.5
    done
    "$B" bench --url "http://127.0.0.1:$port" --concurrency 2 --requests 4 --prompt-len 16 \
      --output-len 16 >/dev/null 2>&1  # warm-up
    for c in 1 16; do
      echo -n "$name round $round, $c client(s): "
      "$B" bench --url "http://127.0.0.1:$port" --concurrency $c --requests $((c * 2)) \
        --prompt-len 16 --output-len 64 2>&1 | grep -E "output tokens/s"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
