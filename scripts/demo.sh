#!/usr/bin/env bash
# Sets up and runs the demo: relay, transceiver, parrot agent (turn-taking;
# -mode echo for the echo that `switchboard call` and `load` check) and web
# page on loopback. Open http://127.0.0.1:8080 and click Call. Extra flags go
# to `switchboard demo` (e.g. -http 127.0.0.1:9000 -relay 127.0.0.1:3479).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh build
exec go run ./cmd/switchboard demo "$@"
