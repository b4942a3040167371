#!/usr/bin/env bash
# Sets up and runs every test, with the race detector, including the
# headless Chromium test and a short run of each fuzz target, after go vet
# and the staticcheck linter.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh test
# The Kubernetes control plane that the chart and membership tests run
# (etcd, kube-apiserver, kube-controller-manager from pinned modules):
# built in the background while vet and staticcheck run; cached, so only
# a cold machine builds (docs/operations.md, "Verified on a real API
# server").
kube_out=$(mktemp)
kube_log=$(mktemp)
trap 'rm -f "$kube_out" "$kube_log"' EXIT
scripts/kube-build.sh >"$kube_out" 2>"$kube_log" &
kube_pid=$!
go vet ./...
# staticcheck, pinned (the module proxy serves it; nothing to install).
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
if ! wait "$kube_pid"; then
  tail -n 40 "$kube_log"
  echo "scripts/kube-build.sh failed" >&2
  exit 1
fi
cat "$kube_log"
SWITCHBOARD_KUBE_BIN=$(cat "$kube_out")
export SWITCHBOARD_KUBE_BIN
go test -race -count=1 -timeout 20m ./...
# Each fuzz target briefly (longer runs: see docs/security.md).
fuzztime=${FUZZTIME:-5s}
# A failing input is saved under testdata/fuzz and fails the retry too; a
# retry that passes means the fuzzing engine itself stumbled (it can time
# out its workers on a loaded machine), which is shown but not fatal.
# Minimizing a new "interesting" input may take the engine up to a minute
# by default, past a 5 s run's deadline ("context deadline exceeded" with
# 0 execs/s): bound it by count.
fuzz() {
  go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" -fuzzminimizetime 200x "$1" >"$log" 2>&1
}
log=$(mktemp)
trap 'rm -f "$log" "$kube_out" "$kube_log"' EXIT
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target ($fuzztime)"
    if ! fuzz "$pkg" "$target"; then
      tail -n 30 "$log"
      echo "fuzz $pkg $target failed; running it again (a real failing input fails again)"
      if ! fuzz "$pkg" "$target"; then
        tail -n 30 "$log"
        exit 1
      fi
    fi
  done
done
echo "fuzz: all targets ran"
