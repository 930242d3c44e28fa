#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang into build-fuzz/ and
# runs each for a bounded time, one after the other on one core:
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     # default: 60 s each, every target
#
# Each target starts from its corpus in the repository (tests/fuzz/corpus/
# TARGET/); what it finds that adds coverage is merged back (libFuzzer
# -merge=1), so the repository keeps a minimized corpus: the seed-* files
# (tests/fuzz/make_seeds.py; wire_messages' from wire_seeds, run here) plus
# what the merge keeps. Crashing, leaking,
# slow and out-of-memory inputs go to tests/fuzz/crashes/TARGET/ (git-ignored);
# each one found becomes a unit test once fixed (tests/data/fuzz/).
# Prints executions, coverage (cov: edges, ft: features) and findings per
# target; exits 1 when anything was found.
#
# Packages (Debian 12): clang and libclang-rt-14-dev (libFuzzer, ASan, UBSan)
# on top of scripts/setup.sh's -dev packages. Only this script needs them: CI
# runs scripts/test.sh, which builds with g++ alone.
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_BUILD_JOBS (default
# nproc), FUZZ_ARGS (extra libFuzzer flags for every run, e.g. -jobs=2).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=60
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  SECONDS_EACH=$1
  shift
fi
ALL_TARGETS=(http_request http_server openai_request sse_stream config config_overrides
  llama2c safetensors hf_dir tokenizer_model tokenizer_json jinja_template grammar wire_messages
  basp_frames)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [ -f "tests/fuzz/fuzz_$t.cpp" ] || { echo "fuzz: no target '$t' (tests/fuzz/fuzz_$t.cpp)" >&2; exit 2; }
done

# ---- packages ----
TROUPE_EXTRA_PACKAGES="clang libclang-rt-14-dev" TROUPE_SKIP_BUILD=1 scripts/setup.sh

# ---- build: a second build directory, since CMake picks one compiler per
# directory. No CUDA there: the fuzzers drive host code only. ----
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTROUPE_FUZZ=ON \
  -DTROUPE_BUILD_TESTS=OFF -DCMAKE_CUDA_COMPILER=/nonexistent/nvcc "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j"${FUZZ_BUILD_JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

# The wire messages' seeds are real messages serialized by CAF: written
# afresh from tests/fuzz/wire_samples.h, so that they follow the wire types.
if [[ " ${TARGETS[*]} " == *" wire_messages "* ]]; then
  cmake --build "$BUILD" -j"${FUZZ_BUILD_JOBS:-$(nproc)}" --target wire_seeds
  "$BUILD/tests/fuzz/wire_seeds" tests/fuzz/corpus/wire_messages
fi

# ---- run ----
dict_for() {
  case "$1" in
    http_*) echo http ;;
    openai_request) echo json_api ;;
    sse_stream) echo sse ;;
    config*) echo config ;;
    hf_dir | safetensors) echo checkpoint ;;
  esac
}

# The last value of `key:` in libFuzzer's status lines.
last_stat() { grep -oE "$1: *[0-9]+" "$2" | tail -1 | grep -oE '[0-9]+$' || echo 0; }
final_stat() { grep -oE "stat::$1: *[0-9]+" "$2" | tail -1 | grep -oE '[0-9]+$' || echo 0; }

found_any=0
summary=()
for t in "${TARGETS[@]}"; do
  corpus=tests/fuzz/corpus/$t
  crashes=tests/fuzz/crashes/$t
  out=$BUILD/fuzz-out/$t
  rm -rf "$out"
  mkdir -p "$corpus" "$crashes" "$out/new" "$out/merged"
  before=$(ls "$crashes" | wc -l)
  flags=(-max_total_time="$SECONDS_EACH" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
    -close_fd_mask=1 -artifact_prefix="$crashes/")
  d=$(dict_for "$t")
  [ -n "$d" ] && flags+=(-dict="tests/fuzz/dict/$d.dict")
  echo "fuzz: $t for ${SECONDS_EACH}s (log: $out/log)"
  # New inputs land in $out/new; the repository's corpus is read only here.
  rc=0
  # shellcheck disable=SC2086
  "$BUILD/tests/fuzz/fuzz_$t" "${flags[@]}" ${FUZZ_ARGS:-} "$out/new" "$corpus" >"$out/log" 2>&1 || rc=$?

  # Minimize: the seeds stay, then whatever of the old corpus and the new
  # inputs adds an edge to them. Edges, not hit counts (-use_counters=0):
  # counters would keep thousands of near-copies in the repository.
  cp "$corpus"/seed-* "$out/merged/" 2>/dev/null || true
  # (a crashing input met while merging is written under $out, not here)
  if "$BUILD/tests/fuzz/fuzz_$t" -merge=1 -use_counters=0 -close_fd_mask=1 -rss_limit_mb=2048 -timeout=25 \
    -artifact_prefix="$out/" \
    "$out/merged" "$corpus" "$out/new" >"$out/merge.log" 2>&1; then
    find "$corpus" -type f -delete
    cp "$out/merged"/* "$corpus/"
  else
    echo "fuzz: $t: merging the corpus failed (see $out/merge.log); corpus left as it was" >&2
  fi

  findings=$(($(ls "$crashes" | wc -l) - before))
  [ "$rc" -ne 0 ] && [ "$findings" -eq 0 ] && findings=1  # died without an artifact
  [ "$findings" -gt 0 ] && found_any=1
  summary+=("$(printf '%-18s %12s %9s %7s %8s %6s %8s  %s' "$t" \
    "$(final_stat number_of_executed_units "$out/log")" "$(final_stat average_exec_per_sec "$out/log")" \
    "$(last_stat cov "$out/log")" "$(last_stat ft "$out/log")" "$(ls "$corpus" | wc -l)" \
    "$(du -sk --apparent-size "$corpus" | cut -f1)K" "$findings")")
  if [ "$findings" -gt 0 ]; then
    grep -E "^(==[0-9]+==ERROR|SUMMARY|fuzz: broken promise)|^artifact_prefix|Test unit written" "$out/log" | head -5 | sed 's/^/    /' >&2
  fi
done

echo
printf '%-18s %12s %9s %7s %8s %6s %8s  %s\n' target executions exec/s cov ft files corpus findings
printf '%s\n' "${summary[@]}"
total_kb=$(du -sk --apparent-size tests/fuzz/corpus | cut -f1)
echo "corpus total: ${total_kb}K in tests/fuzz/corpus; findings under tests/fuzz/crashes/"
[ "$total_kb" -gt 2048 ] && echo "fuzz: the corpus is over 2 MB; keep it small (-max_len, fewer seeds)" >&2
exit $found_any
