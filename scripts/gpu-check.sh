#!/usr/bin/env bash
# The CUDA backend's device check: on a machine with an NVIDIA GPU, runs the
# GPU tests (JUnit XML into the output folder) and the GPU benchmark, and ends
# with a table of figures against the bounds. Says clearly when it finds no
# GPU (exit 2). Well under 5 minutes on an H200.
#
#   scripts/gpu-check.sh --bundle DIR   on the build machine: copy the built
#                                       gpu_tests and bench_cuda (stripped) and
#                                       the non-CUDA shared libraries they need
#                                       into DIR, to take to the GPU machine
#   scripts/gpu-check.sh [--from DIR] [--out DIR] [--build DIR] [--quick]
#                                       run: binaries from a bundle (--from),
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
    *) echo "usage: $0 [--bundle DIR] [--from DIR] [--out DIR] [--build DIR] [--quick]" >&2; exit 64 ;;
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

if [ -n "$BUNDLE_TO" ]; then
  for b in "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda"; do
    [ -x "$b" ] || { echo "missing $b: build it first (cmake --build $BUILD --target gpu_tests bench_cuda)" >&2; exit 1; }
  done
  rm -rf "$BUNDLE_TO" && mkdir -p "$BUNDLE_TO/bin" "$BUNDLE_TO/lib"
  for b in "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda"; do
    strip -o "$BUNDLE_TO/bin/$(basename "$b")" "$b"
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      is_machine_lib "$name" || cp -L "$path" "$BUNDLE_TO/lib/$name"
    done
  done
  echo "bundle in $BUNDLE_TO ($(du -sh "$BUNDLE_TO" | cut -f1)); carried libraries:"
  ls "$BUNDLE_TO/lib"
  exit 0
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
  BIN="$OUT_DIR/.bin" && mkdir -p "$BIN"
  cp "$BUILD/tests/gpu_tests" "$BUILD/gpu/cuda/bench_cuda" "$BIN/"
  echo "binaries from $BUILD"
else
  say "no built binaries: building here (fallback)"
  BUILD=build-gpu-check
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_SANITIZE_TESTS=OFF \
         && cmake --build "$BUILD" -j"$(nproc)" --target gpu_tests bench_cuda; } >"$OUT_DIR/build.log" 2>&1; then
    tail -20 "$OUT_DIR/build.log"
    echo "GPU CHECK FAILED: the fallback build failed (log: $OUT_DIR/build.log)"
    exit 1
  fi
  BIN="$BUILD/tests"
  cp "$BUILD/gpu/cuda/bench_cuda" "$BIN/"
fi
export LD_LIBRARY_PATH="${LIBS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TROUPE_SOURCE_DIR="$ROOT"

say "ldd"
MISSING=0
for b in "$BIN/gpu_tests" "$BIN/bench_cuda"; do
  echo "$b:"
  ldd "$b" | sed 's/^/  /'
  ldd "$b" | grep -q "not found" && MISSING=1
done
if [ "$MISSING" = 1 ]; then
  echo "GPU CHECK FAILED: shared libraries not found (above)"
  exit 1
fi

say "device"
AVAIL=$("$BIN/gpu_tests" --gtest_filter='CudaAvailability.*' 2>&1 | grep 'cuda_device_available:')
echo "$AVAIL"
case "$AVAIL" in
  *"available: yes"*) ;;
  *)
    echo
    echo "NO GPU FOUND (${AVAIL#*: }): the GPU tests skip and nothing is measured."
    "$BIN/gpu_tests" --gtest_output="xml:$OUT_DIR/gpu_tests.xml" >"$OUT_DIR/gpu_tests.log" 2>&1
    echo "gpu tests: $(grep -c '^\[  SKIPPED \]' "$OUT_DIR/gpu_tests.log") lines of skipped tests (log: $OUT_DIR/gpu_tests.log)"
    exit 2
    ;;
esac

say "GPU tests"
timeout 240 "$BIN/gpu_tests" --gtest_output="xml:$OUT_DIR/gpu_tests.xml" 2>&1 | tee "$OUT_DIR/gpu_tests.log" |
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|batch invariance|NCCL at run time|^\[  PASSED|^\[==' 
TESTS_RC=${PIPESTATUS[0]}

say "benchmark"
timeout 240 "$BIN/bench_cuda" $QUICK 2>&1 | tee "$OUT_DIR/bench.txt"
BENCH_RC=${PIPESTATUS[0]}

say "summary"
if [ -f "$OUT_DIR/gpu_tests.xml" ]; then
  grep -o '<testsuites[^>]*>' "$OUT_DIR/gpu_tests.xml" | head -1
fi
echo "gpu tests exit $TESTS_RC, benchmark exit $BENCH_RC; results in $OUT_DIR"
[ "$TESTS_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
