#!/usr/bin/env bash
# The CUDA backend's device check: on a machine with an NVIDIA GPU, runs the
# GPU tests (JUnit XML into the output folder), the GPU benchmark, and the
# serving integration tests with every test server on `kind: cuda`, and ends
# with a table of figures against the bounds. Says clearly when it finds no
# GPU (exit 2). A few minutes on an H200; each section has a time limit,
# 300 s in all at worst (tests 120, bench_cuda 75, troupe bench 45, serving
# 60), so that with a machine's start one run fits well inside a 15-minute
# device budget and leaves room to run it again.
#
# Serving on CUDA needs troupe built with -DTROUPE_SERVE_CUDA=ON:
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_SERVE_CUDA=ON
#   cmake --build build-cuda --target gpu_tests bench_cuda troupe integration_tests
#   scripts/gpu-check.sh --build build-cuda --bundle gpu-bundle.tar.xz
# A build without it runs the kernels' tests and the benchmark only.
#
#   scripts/gpu-check.sh --bundle DIR   on the build machine: copy the built
#                                       gpu_tests and bench_cuda (stripped) and
#                                       the non-CUDA shared libraries they need
#                                       into DIR, to take to the GPU machine;
#                                       DIR ending in .tar.xz: the same packed
#                                       into one file (about 12 MB, not 65)
#   scripts/gpu-check.sh [--from DIR] [--out DIR] [--build DIR] [--quick]
#                                       run: binaries from a bundle (--from, a
#                                       folder or a .tar.xz),
#                                       else from the build folder (default
#                                       build/), else built here with cmake +
#                                       ninja (fallback); results into --out
#                                       (default gpu-check-out/)
#
# The GPU machine's own CUDA libraries are used: its Python packages'
# nvidia-* folders and /usr/local/cuda/lib64, found below and shown by ldd.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BUNDLE_TO="" FROM="" OUT_DIR="gpu-check-out" BUILD="build" QUICK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE_TO=$2; shift 2 ;;
    --from) FROM=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    *) echo "usage: $0 [--bundle DIR|FILE.tar.xz] [--from DIR|FILE.tar.xz] [--out DIR] [--build DIR] [--quick]" >&2; exit 64 ;;
  esac
done

say() { printf '\n== %s ==\n' "$*"; }

# Libraries that come from the GPU machine itself (driver, CUDA, NCCL) or
# from any C library; everything else a binary needs travels in the bundle.
is_machine_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*) return 0 ;;
    libcuda.so*|libcudart*|libcublas*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}

# troupe linked with the CUDA engine (-DTROUPE_SERVE_CUDA=ON), and the
# serving tests that drive it: both, or neither.
serving_binaries() {
  local troupe=$1 tests=$2
  [ -x "$troupe" ] && [ -x "$tests" ] || return 1
  # grep reads all of ldd's output: with -q it would stop at the first
  # match, and under pipefail ldd's SIGPIPE would fail the test.
  ldd "$troupe" | grep 'libcublas' >/dev/null || return 1
  echo "$troupe $tests"
}

# Scratch folders (copies of binaries, unpacked bundles) go when the
# script ends, however it ends.
SCRATCH=()
cleanup() { [ ${#SCRATCH[@]} -eq 0 ] || rm -rf "${SCRATCH[@]}"; }
trap cleanup EXIT

# A bundle asked for as a .tar.xz is made in a scratch folder, then packed.
PACK_TO=""
case "$BUNDLE_TO" in
  *.tar.xz)
    PACK_TO=$BUNDLE_TO
    SCRATCH_BUNDLE=$(mktemp -d) && SCRATCH+=("$SCRATCH_BUNDLE")
    BUNDLE_TO=$SCRATCH_BUNDLE/gpu-bundle
    ;;
esac

if [ -n "$BUNDLE_TO" ]; then
  for b in "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda"; do
    [ -x "$b" ] || { echo "missing $b: build it first (cmake --build $BUILD --target gpu_tests bench_cuda)" >&2; exit 1; }
  done
  rm -rf "$BUNDLE_TO" && mkdir -p "$BUNDLE_TO/bin" "$BUNDLE_TO/lib"
  SERVING=$(serving_binaries "$BUILD/troupe" "$BUILD/tests/integration_tests")
  if [ -z "$SERVING" ]; then
    echo "note: no troupe with the CUDA engine in $BUILD (configure with -DTROUPE_SERVE_CUDA=ON and build troupe and integration_tests): serving on CUDA is not bundled" >&2
  fi
  for b in "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda" $SERVING; do
    strip -o "$BUNDLE_TO/bin/$(basename "$b")" "$b"
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      is_machine_lib "$name" || cp -L "$path" "$BUNDLE_TO/lib/$name"
    done
  done
  if [ -n "$PACK_TO" ]; then
    mkdir -p "$(dirname "$PACK_TO")"
    tar -cf - -C "$BUNDLE_TO" . | xz -T0 -6 >"$PACK_TO" || { echo "packing $PACK_TO failed" >&2; exit 1; }
    echo "bundle in $PACK_TO ($(du -sh "$PACK_TO" | cut -f1), $(du -sh "$BUNDLE_TO" | cut -f1) unpacked); carried libraries:"
  else
    echo "bundle in $BUNDLE_TO ($(du -sh "$BUNDLE_TO" | cut -f1)); carried libraries:"
  fi
  ls "$BUNDLE_TO/lib"
  exit 0
fi

# A packed bundle is unpacked into a scratch folder (tar with xz, or
# Python's tarfile where xz is missing).
if [ -n "$FROM" ] && [ -f "$FROM" ]; then
  UNPACKED=$(mktemp -d) && SCRATCH+=("$UNPACKED")
  if command -v xz >/dev/null 2>&1; then
    tar -xJf "$FROM" -C "$UNPACKED"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$FROM" "$UNPACKED"
  fi || { echo "GPU CHECK FAILED: cannot unpack $FROM"; exit 1; }
  echo "unpacked $FROM into $UNPACKED"
  FROM=$UNPACKED
fi

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)

say "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi

say "CUDA libraries of this machine"
LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && LIBS="$LIBS:$d"; done
if command -v python3 >/dev/null 2>&1; then
  # Wheels such as nvidia-cublas and nvidia-nccl put their libraries under
  # site-packages/nvidia/*/lib (and cu13/lib in newer ones).
  PYLIBS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
dirs = set()
for r in roots:
    for pattern in ("nvidia/*/lib", "nvidia/*/*/lib", "nvidia/lib"):
        dirs.update(d for d in glob.glob(os.path.join(r, pattern)) if os.path.isdir(d))
print(":".join(sorted(dirs)))
PY
)
  [ -n "$PYLIBS" ] && LIBS="$LIBS:$PYLIBS"
fi
echo "${LIBS#:}" | tr ':' '\n' | sed 's/^/  /'

if [ -n "$FROM" ]; then
  BIN="$FROM/bin"
  LIBS="$(cd "$FROM/lib" && pwd)$LIBS"
  echo "binaries from the bundle $FROM"
elif [ -x "$BUILD/tests/gpu_tests" ] && [ -x "$BUILD/gpu/cuda/bench_cuda" ]; then
  # Not under OUT_DIR: whatever lands there may be fetched back (a few
  # files of limited size), and the results must not be crowded out.
  BIN_DIR=$(mktemp -d) && SCRATCH+=("$BIN_DIR")
  BIN="$BIN_DIR/bin" && mkdir -p "$BIN"
  cp "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda" "$BIN/"
  [ -x "$BUILD/troupe" ] && [ -x "$BUILD/tests/integration_tests" ] &&
    cp "$BUILD/troupe" "$BUILD/tests/integration_tests" "$BIN/"
  echo "binaries from $BUILD"
else
  say "no built binaries: building here (fallback)"
  BUILD=build-gpu-check
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_SANITIZE_TESTS=OFF \
           -DTROUPE_SERVE_CUDA=ON \
         && cmake --build "$BUILD" -j"$(nproc)" --target gpu_tests bench_cuda troupe integration_tests; } >"$OUT_DIR/build.log" 2>&1; then
    tail -20 "$OUT_DIR/build.log"
    echo "GPU CHECK FAILED: the fallback build failed (log: $OUT_DIR/build.log)"
    exit 1
  fi
  BIN="$BUILD/tests"
  cp "$BUILD/gpu/cuda/bench_cuda" "$BUILD/troupe" "$BIN/"
fi
export LD_LIBRARY_PATH="${LIBS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TROUPE_SOURCE_DIR="$ROOT"
# NCCL says why when it fails; an image's TF32 default must not turn the f32
# comparisons' matrix products into TF32.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}" NVIDIA_TF32_OVERRIDE=0

for b in "$BIN/gpu_tests" "$BIN/bench_cuda"; do
  if [ ! -x "$b" ]; then
    echo "GPU CHECK FAILED: $b is missing (is the bundle there, and carried?)"
    exit 1
  fi
done

SERVING=$(serving_binaries "$BIN/troupe" "$BIN/integration_tests")

say "ldd"
MISSING=0
for b in "$BIN/gpu_tests" "$BIN/bench_cuda" $SERVING; do
  echo "$b:"
  ldd "$b" | sed 's/^/  /'
  ldd "$b" | grep "not found" >/dev/null && MISSING=1
done
if [ "$MISSING" = 1 ]; then
  echo "GPU CHECK FAILED: shared libraries not found (above)"
  exit 1
fi

say "device"
AVAIL_RAW=$("$BIN/gpu_tests" --gtest_filter='CudaAvailability.*' 2>&1)
AVAIL=$(echo "$AVAIL_RAW" | grep 'cuda_device_available:')
if [ -z "$AVAIL" ]; then
  echo "$AVAIL_RAW" | tail -20
  echo "GPU CHECK FAILED: gpu_tests did not report whether a device answers (output above)"
  exit 1
fi
echo "$AVAIL"
case "$AVAIL" in
  *"available: yes"*) ;;
  *)
    echo
    echo "NO GPU FOUND (${AVAIL#*: no (}: the GPU tests skip and nothing is measured."
    "$BIN/gpu_tests" --gtest_output="xml:$OUT_DIR/gpu_tests.xml" >"$OUT_DIR/gpu_tests.log" 2>&1
    echo "gpu tests: $(grep -c '^\[  SKIPPED \]' "$OUT_DIR/gpu_tests.log") lines of skipped tests (log: $OUT_DIR/gpu_tests.log)"
    exit 2
    ;;
esac

say "GPU tests"
timeout -k 10 120 "$BIN/gpu_tests" --gtest_output="xml:$OUT_DIR/gpu_tests.xml" 2>&1 | tee "$OUT_DIR/gpu_tests.log" |
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|batch invariance|NCCL at run time|^\[  PASSED|^\[==' 
TESTS_RC=${PIPESTATUS[0]}

say "benchmark"
timeout -k 10 75 "$BIN/bench_cuda" $QUICK 2>&1 | tee "$OUT_DIR/bench.txt"
BENCH_RC=${PIPESTATUS[0]}

say "troupe bench on kind: cuda (the 1b preset, TinyLlama's shape, bf16)"
TROUPE_BENCH_RC=skipped
if [ -n "$SERVING" ]; then
  timeout -k 10 45 "$BIN/troupe" bench --preset 1b --dtype bf16 --batch 1,8,32,128 --prompt-len 512 \
    --decode-tokens 32 --set 'devices=[{kind: cuda, index: 0, threads: 2}]' 2>&1 |
    tee "$OUT_DIR/troupe_bench_1b.txt" | grep -v '^\[' 
  TROUPE_BENCH_RC=${PIPESTATUS[0]}
else
  echo "not run: no troupe built with -DTROUPE_SERVE_CUDA=ON beside the tests"
fi

say "serving on kind: cuda"
SERVE_RC=0
if [ -n "$SERVING" ]; then
  # The serving integration tests as they run in CI, with every test server
  # on the GPU in deterministic mode (a sequence's tokens do not depend on
  # its batch), and the reference answers (troupe generate) from the same
  # GPU. Four gtest shards run at once, each with its own XML, so that the
  # many server start-ups fit the time limit.
  SERVE_SET='devices=[{kind: cuda, index: 0, threads: 2}];cuda.deterministic=true'
  pids=()
  for shard in 0 1 2 3; do
    TROUPE_BINARY="$BIN/troupe" TROUPE_TEST_SERVE_SET="$SERVE_SET" GTEST_TOTAL_SHARDS=4 \
      GTEST_SHARD_INDEX=$shard timeout -k 10 60 "$BIN/integration_tests" \
      --gtest_filter='Serve.*:ServeDevices.*:ServeLayouts.*' \
      --gtest_output="xml:$OUT_DIR/serve_cuda_$shard.xml" >"$OUT_DIR/serve_cuda_$shard.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    wait "${pids[$i]}" || SERVE_RC=$?
    grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|^\[  PASSED|^\[==' "$OUT_DIR/serve_cuda_$i.log"
  done
else
  echo "not run: no troupe built with -DTROUPE_SERVE_CUDA=ON beside the tests (see the top of this script)"
  SERVE_RC=skipped
fi

say "summary"
for x in gpu_tests serve_cuda_0 serve_cuda_1 serve_cuda_2 serve_cuda_3; do
  [ -f "$OUT_DIR/$x.xml" ] && echo "$x: $(grep -o '<testsuites[^>]*>' "$OUT_DIR/$x.xml" | head -1)"
done
echo "gpu tests exit $TESTS_RC, benchmark exit $BENCH_RC, troupe bench exit $TROUPE_BENCH_RC, serving on cuda exit $SERVE_RC; results in $OUT_DIR"
ok() { [ "$1" = 0 ] || [ "$1" = skipped ]; }
[ "$TESTS_RC" = 0 ] && [ "$BENCH_RC" = 0 ] && ok "$TROUPE_BENCH_RC" && ok "$SERVE_RC"
