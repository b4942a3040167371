#!/usr/bin/env bash
# Builds the Kubernetes control plane the tests run against (etcd,
# kube-apiserver, kube-controller-manager) from the pinned modules of
# internal/testsupport/kube/build, and prints the directory that holds
# them. The module proxy is the only download; nothing prebuilt is used.
#
# The binaries are cached under ${XDG_CACHE_HOME:-~/.cache}/switchboard/kube/
# keyed by a hash of the build module's go.mod and go.sum, so a warm
# machine builds nothing: only a change of the pinned versions (or of this
# script) builds again. A cold build compiles all of Kubernetes' control
# plane: about ten minutes on two cores (docs/operations.md).
#
# With --node it also builds what a real node needs, kubelet, kube-proxy
# and kube-scheduler, for the real-node test (scripts/kube-node.sh,
# docs/operations.md "A real node"): about as long again on a cold
# machine, so only on request.
#
# Usage: scripts/kube-build.sh [--node]     build if needed, print the dir
#        scripts/kube-build.sh -n [--node]  print the dir if built, else fail
#        KUBE_BIN_DIR=dir scripts/…         use that dir instead of the cache
set -euo pipefail
check_only=false
node=false
for arg in "$@"; do
  case $arg in
    -n) check_only=true ;;
    --node) node=true ;;
    *) echo "kube-build: unknown argument $arg (want -n, --node)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
mod=internal/testsupport/kube/build
version=$(cd "$mod" && go list -m -f "{{.Version}}" k8s.io/kubernetes 2>/dev/null || true)
if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "kube-build: no k8s.io/kubernetes version in $mod/go.mod" >&2
  exit 1
fi
key=$(cat "$mod/go.mod" "$mod/go.sum" scripts/kube-build.sh | sha256sum | cut -c1-16)
dir=${KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/switchboard/kube/$version-$key}
tools=(etcd kube-apiserver kube-controller-manager)
if $node; then tools+=(kubelet kube-proxy kube-scheduler); fi
ready() {
  for t in "${tools[@]}"; do [[ -x "$dir/$t" ]] || return 1; done
}
if ready; then
  echo "$dir"
  exit 0
fi
if $check_only; then
  echo "$dir: no build of Kubernetes $version yet" >&2
  exit 3
fi
mkdir -p "$dir"
# Concurrent runs (two test commands at once) build once.
exec 9>"$dir.lock"
flock 9
if ready; then
  echo "$dir"
  exit 0
fi
start=$(date +%s)
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$(echo "${version#v}" | cut -d. -f1) -X $pkg.gitMinor=$(echo "${version#v}" | cut -d. -f2) -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
tmp=$(mktemp -d "$dir.tmp.XXXX")
trap 'rm -rf "$tmp"' EXIT
(
  cd "$mod"
  # -mod=mod: the module's go.sum pins every version; nothing is vendored.
  # Only what is missing: a node build after a control plane build (or
  # the reverse) compiles just the rest.
  kube=()
  for t in "${tools[@]}"; do
    if [[ $t != etcd && ! -x "$dir/$t" ]]; then kube+=("k8s.io/kubernetes/cmd/$t"); fi
  done
  if ((${#kube[@]})); then
    CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$ldflags" -o "$tmp/" "${kube[@]}"
  fi
  if [[ ! -x "$dir/etcd" ]]; then
    CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  fi
)
for t in "${tools[@]}"; do
  if [[ -e "$tmp/$t" ]]; then mv "$tmp/$t" "$dir/$t"; fi
done
echo "kube-build: built ${tools[*]} $version in $(( $(date +%s) - start ))s" >&2
echo "$dir"
