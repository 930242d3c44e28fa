#!/bin/bash
# The figures behind troupe simulate (issue 13), from the repository root:
#   benchmarks/simulate.sh scale     # 1,000 replicas x TP=4, 1,000,000 requests, per policy
#   benchmarks/simulate.sh sweep     # 4 replicas, one 3x slower: policies x rates, with the plot
#   benchmarks/simulate.sh validate  # the four policies at two loads against a real troupe serve
# This machine is shared: run the timed ones when it is quiet, and read the
# real server's run-to-run spread printed beside every validation figure.
set -euo pipefail
B=${TROUPE:-build/troupe}
OUT=${OUT:-benchmarks/figures}
mkdir -p "$OUT"
case "${1:-all}" in
  scale | all)
    for policy in least_outstanding round_robin power_of_two latency_aware; do
      /usr/bin/time -f "$policy: %e s wall, %U s user, %M KiB peak" \
        "$B" simulate --config configs/sim-cluster.yaml --profile benchmarks/profiles/110m.json \
        --set routing.policy="$policy" --rate 1500 --requests 1000000 \
        --prompt uniform:16:256 --output uniform:16:112 --sample-s 0 | tail -1
    done
    ;;&
  sweep | all)
    "$B" simulate --profile benchmarks/profiles/110m.json --set parallel.replicas=4 --sweep \
      --rates 1,2,3,4,5,6 --requests 2000 --prompt uniform:16:256 --output uniform:16:128 \
      --slow 3:3 --slo-ttft-s 2 --slo-tpot-s 0.15 --out "$OUT/sweep_slow_replica" |
      tee "$OUT/sweep_slow_replica/table.txt"
    ;;&
  validate | all)
    "$B" simulate --config configs/two-replicas.yaml --calibrate
    "$B" simulate --validate --config configs/two-replicas.yaml --loads 0.3,0.7 --requests 80 \
      --prompt-len 32 --output-len 32 --repeats 3 | tee "$OUT/validate_fortune_2replicas.txt"
    "$B" simulate --config configs/two-replicas.yaml --calibrate
    "$B" simulate --validate --config configs/two-replicas.yaml --slow 1:3 --loads 0.3,0.6 \
      --requests 80 --prompt-len 32 --output-len 32 --repeats 3 |
      tee "$OUT/validate_fortune_2replicas_slow.txt"
    ;;
esac
