#!/usr/bin/env bash
# Two builds of troupe side by side on this machine, interleaved (A, B, A,
# B, ...) so that noise from other work falls on both: engine decode and
# prefill tokens/s (`troupe bench --preset`), and serving output tokens/s
# (`troupe serve` on the bundled model, loaded by `troupe bench --url`).
# Prints the median of each and the ratio B / A.
#
#   scripts/bench-ab.sh OLD_TROUPE NEW_TROUPE [ROUNDS]     # default 3 rounds
#
# Environment: PRESET (110m), BATCHES (1,32), THREADS (2), CONCURRENCY (16),
# REQUESTS (300), OUTPUT_LEN (64).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
A=$1 B=$2 ROUNDS=${3:-3}
PRESET=${PRESET:-110m} BATCHES=${BATCHES:-1,32} THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-16} REQUESTS=${REQUESTS:-300} OUTPUT_LEN=${OUTPUT_LEN:-64}
OUT=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$OUT"' EXIT

engine() {  # $1 binary -> JSON line
  "$1" bench --preset "$PRESET" --batch "$BATCHES" --threads "$THREADS" --prompt-len 64 \
    --decode-tokens 16 --repeats 2 --json 2>/dev/null
}
# Each build reads the config of its own tree (the schema may differ).
config_of() {
  local c; c=$(dirname "$1")/../configs/default.yaml
  [ -f "$c" ] && echo "$c" || echo configs/default.yaml
}
serving() {  # $1 binary -> output tokens/s
  : >"$OUT/serve.log"
  "$1" serve --config "$(config_of "$1")" --listen 127.0.0.1:0 2>"$OUT/serve.log" &
  SERVER=$!
  local port=
  for _ in $(seq 600); do
    port=$(grep -m1 -o 'listening on http://[0-9.]*:[0-9]*' "$OUT/serve.log" | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "bench-ab: $1 serve did not start:" >&2; cat "$OUT/serve.log" >&2; exit 1; }
  "$1" bench --url "http://127.0.0.1:$port" -c "$CONCURRENCY" -n "$REQUESTS" --prompt-len 32 \
    --output-len "$OUTPUT_LEN" --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["output_tokens_per_s"])'
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
}

for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$A; [ $side = B ] && bin=$B
    engine "$bin" >>"$OUT/engine.$side"
    serving "$bin" >>"$OUT/serving.$side"
  done
  echo "round $r done" >&2
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def engine(side):
    rows = [json.loads(l) for l in open(f"{out}/engine.{side}") if l.strip()]
    res = {"prefill": statistics.median(r["prefill_tokens_per_s"] for r in rows)}
    for b in rows[0]["decode"]:
        res[f"decode b{b['batch']}"] = statistics.median(
            d["tokens_per_s"] for r in rows for d in r["decode"] if d["batch"] == b["batch"])
    return res
a, b = engine("A"), engine("B")
sa = statistics.median(float(x) for x in open(f"{out}/serving.A"))
sb = statistics.median(float(x) for x in open(f"{out}/serving.B"))
a["serving"], b["serving"] = sa, sb
print(f"{'tokens/s (median)':<20}{'A':>10}{'B':>10}{'B/A':>8}")
for k in a:
    print(f"{k:<20}{a[k]:>10.1f}{b[k]:>10.1f}{b[k] / a[k]:>8.2f}")
PY
