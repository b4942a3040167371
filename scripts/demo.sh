#!/usr/bin/env bash
# Sets up and runs the demo: relay, transceiver, parrot agent (turn-taking;
# -mode echo for the echo that `switchboard call` and `load` check) and web
# page on loopback. Open http://127.0.0.1:8080 and click Call. Extra flags go
# to `switchboard demo` (e.g. -http 127.0.0.1:9000 -relay 127.0.0.1:3479).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh build
# go run says nothing while it compiles: a minute or more the first time.
echo "scripts/demo.sh: compiling and starting the demo (the first time takes a minute or two)..." >&2
exec go run ./cmd/switchboard demo "$@"
