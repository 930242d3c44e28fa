#!/usr/bin/env bash
# Installs the Debian packages Troupe needs (idempotent: does nothing slow when
# they are present), then configures and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config
  libcaf-dev libspdlog-dev libboost-dev libopenblas-dev
  libsentencepiece-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev curl)
# Callers that need more (scripts/fuzz.sh: clang) name them here.
read -r -a EXTRA <<<"${TROUPE_EXTRA_PACKAGES:-}"
PACKAGES+=("${EXTRA[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${TROUPE_SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${TROUPE_CMAKE_ARGS:-}
  cmake --build build -j"$(nproc)"
fi
