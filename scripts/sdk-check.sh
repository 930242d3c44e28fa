#!/usr/bin/env bash
# Real clients against `troupe serve`: the official openai npm SDK (with
# zod's structured-output helpers) and the Vercel AI SDK, pinned in
# scripts/sdk-check/package.json, on the bundled model. Not part of CI (whose
# machine reaches only Debian's packages): it needs Node.js 18 or later and
# the npm registry.
#
#   scripts/sdk-check.sh [--build DIR] [--port N]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build
PORT=8097
while (($#)); do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    *) echo "sdk-check: unknown argument $1 (--build DIR, --port N)" >&2; exit 2 ;;
  esac
done
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "sdk-check: needs node and npm (Node.js 18 or later)" >&2; exit 2; }
[[ -x "$BUILD/troupe" ]] || { echo "sdk-check: no $BUILD/troupe: run scripts/setup.sh first" >&2; exit 2; }

# The packages install into the build folder, not the source tree.
work="$BUILD/sdk-check"
mkdir -p "$work"
cp scripts/sdk-check/package.json scripts/sdk-check/*.mjs "$work"/
(cd "$work" && npm install --no-audit --no-fund --loglevel=error >/dev/null)

"$BUILD/troupe" serve --config configs/default.yaml --set "server.listen=127.0.0.1:$PORT" \
  --set server.chat_template_file=scripts/sdk-check/tools.jinja >"$work/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 60); do
  if PORT=$PORT node -e "fetch('http://127.0.0.1:'+process.env.PORT+'/v1/models').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"; then
    break
  fi
  kill -0 "$server" 2>/dev/null || { echo "sdk-check: the server stopped; see $work/serve.log" >&2; exit 1; }
  sleep 0.5
done

rc=0
(cd "$work" && PORT=$PORT node openai_sdk.mjs) || rc=1
(cd "$work" && PORT=$PORT node ai_sdk.mjs) || rc=1
(cd "$work" && PORT=$PORT node openai_responses.mjs) || rc=1
(cd "$work" && PORT=$PORT node ai_sdk_responses.mjs) || rc=1
exit $rc
