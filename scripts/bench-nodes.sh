#!/usr/bin/env bash
# Serving throughput of one deployment in one process against the same
# deployment over node processes, on this machine, with the same total
# threads: R replicas of one single-thread device each, either all in
# `troupe serve`, or in R `troupe node` processes joined to a coordinator
# that runs none. The two are measured in turns (ROUNDS each, interleaved),
# each with `troupe bench --url`, and the ratio of their medians printed.
#
#   scripts/bench-nodes.sh [ROUNDS] [REPLICAS]     # defaults: 3 rounds, 2 replicas
#
# Environment: TROUPE (default build/troupe), CONCURRENCY (16), REQUESTS
# (400), OUTPUT_LEN (64), CONFIG (configs/default.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
REPLICAS=${2:-2}
TROUPE=${TROUPE:-build/troupe}
CONFIG=${CONFIG:-configs/default.yaml}
CONCURRENCY=${CONCURRENCY:-16}
REQUESTS=${REQUESTS:-400}
OUTPUT_LEN=${OUTPUT_LEN:-64}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# Waits until FILE has a line containing TEXT; prints the port at its end.
port_from() {
  for _ in $(seq 600); do
    if l=$(grep -m1 "$2" "$1" 2>/dev/null); then echo "${l##*:}" | tr -dc 0-9; return; fi
    sleep 0.1
  done
  echo "bench-nodes: no '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/ready" >/dev/null && return
    sleep 0.1
  done
  echo "bench-nodes: the server on port $1 did not get ready" >&2; exit 1
}
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }

# Output tokens per second of one bench run against port $1.
measure() {
  "$TROUPE" bench --url "http://127.0.0.1:$1" -c "$CONCURRENCY" -n "$REQUESTS" --prompt-len 32 \
    --output-len "$OUTPUT_LEN" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_tokens_per_s"])'
}

one_process() {
  "$TROUPE" serve --config "$CONFIG" --listen 127.0.0.1:0 --set parallel.replicas="$REPLICAS" \
    --set 'devices=[{kind: cpu, threads: 1}]' 2>"$WORK/serve.log" &
  PIDS+=($!)
  local port; port=$(port_from "$WORK/serve.log" "listening on http://")
  wait_ready "$port"
  measure "$port"
  stop_all
}

node_processes() {
  "$TROUPE" serve --config "$CONFIG" --listen 127.0.0.1:0 --set parallel.replicas="$REPLICAS" \
    --set nodes.listen=127.0.0.1:0 --set nodes.local=false 2>"$WORK/coord.log" &
  PIDS+=($!)
  local port join
  port=$(port_from "$WORK/coord.log" "listening on http://")
  join=$(port_from "$WORK/coord.log" "nodes join on ")
  for i in $(seq "$REPLICAS"); do
    "$TROUPE" node --join "127.0.0.1:$join" --name "node-$i" --config "$CONFIG" \
      --set 'devices=[{kind: cpu, threads: 1}]' 2>"$WORK/node-$i.log" &
    PIDS+=($!)
  done
  wait_ready "$port"
  # Ready with the first replica; wait until all of them serve.
  for _ in $(seq 600); do
    [ "$(curl -s "http://127.0.0.1:$port/metrics" | grep -c '^troupe_replica_state{.*} 2$')" -ge "$REPLICAS" ] && break
    sleep 0.1
  done
  measure "$port"
  stop_all
}

one=(); nodes=()
for r in $(seq "$ROUNDS"); do
  one+=("$(one_process)")
  nodes+=("$(node_processes)")
  echo "round $r: one process ${one[-1]} tok/s, $REPLICAS node processes ${nodes[-1]} tok/s" >&2
done
python3 - "${one[*]}" "${nodes[*]}" "$REPLICAS" <<'PY'
import statistics, sys
one = [float(x) for x in sys.argv[1].split()]
nodes = [float(x) for x in sys.argv[2].split()]
m1, m2 = statistics.median(one), statistics.median(nodes)
print(f"{sys.argv[3]} replicas x 1 thread: one process {m1:.0f} tok/s, node processes {m2:.0f} tok/s "
      f"(median of {len(one)}); node processes / one process = {m2 / m1:.2f}")
PY
