#!/usr/bin/env bash
# Sets up (packages, build) and runs every test: unit, integration, sanitize.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
