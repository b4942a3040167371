#!/usr/bin/env bash
# Runs the real-node test, deploy TestNode (docs/operations.md "A real
# node"): a kubelet with Debian's containerd and runc runs the chart's
# relay, transceiver, agent and Redis pods from images built here, a
# client calls through the relay Service's load balancer IP (kube-proxy),
# and a relay pod is deleted under load. Not part of scripts/test.sh: it
# needs root, the packages below, a second Kubernetes build (kubelet,
# kube-proxy, kube-scheduler) and the kernel tunables below.
#
# What it does, in order:
#   1. installs the Debian packages (scripts/deps.sh node: containerd,
#      runc, containernetworking-plugins, dnsmasq-base, …);
#   2. sets the six kernel tunables the kubelet insists on, if they
#      differ (the test runs the kubelet with protectKernelDefaults, so it
#      checks them and changes nothing itself): vm.overcommit_memory=1,
#      vm.panic_on_oom=0, kernel.panic=10, kernel.panic_on_oops=1,
#      kernel.keys.root_maxkeys=1000000, kernel.keys.root_maxbytes=25000000
#      — what every Kubernetes node runs with; note that with them a
#      kernel oops reboots the machine 10 s later;
#   3. builds the control plane and the node's programs
#      (scripts/kube-build.sh --node; cached);
#   4. runs the test with SWITCHBOARD_KUBE_NODE=1.
#
# Everything the test starts lives in network namespaces it creates
# (the node's bridge, veths, kube-proxy's nftables table, the cluster
# DNS) and in its temporary directory (containerd's and runc's state,
# the pods' network namespace files, the kubelet's root); it removes all
# of it when it ends.
#
# Usage: scripts/kube-node.sh [go test flags, e.g. -v]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh node
declare -A tunables=(
  [vm.overcommit_memory]=1 [vm.panic_on_oom]=0 [kernel.panic]=10 [kernel.panic_on_oops]=1
  [kernel.keys.root_maxkeys]=1000000 [kernel.keys.root_maxbytes]=25000000
)
for k in "${!tunables[@]}"; do
  if [[ $(sysctl -n "$k") != "${tunables[$k]}" ]]; then
    echo "kube-node: sysctl $k=${tunables[$k]} (was $(sysctl -n "$k"); the kubelet needs it)" >&2
    sysctl -qw "$k=${tunables[$k]}"
  fi
done
bins=$(scripts/kube-build.sh --node)
SWITCHBOARD_KUBE_NODE=1 SWITCHBOARD_KUBE_BIN=$bins \
  go test -count=1 -timeout 20m -run '^TestNode$' ./deploy/ "$@"
