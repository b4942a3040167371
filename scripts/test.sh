#!/usr/bin/env bash
# Sets up and runs every test, with the race detector, including the
# headless Chromium test and a short run of each fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh test
go vet ./...
go test -race -count=1 -timeout 20m ./...
# Each fuzz target briefly (longer runs: see docs/security.md).
fuzztime=${FUZZTIME:-5s}
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/dev/null
  done
done
echo "fuzz: all targets ran"
