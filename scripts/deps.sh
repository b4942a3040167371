#!/usr/bin/env bash
# Installs the Debian packages Switchboard needs, only those missing.
#   scripts/deps.sh build   libopus for the Opus codec (transceiver PCM formats, `switchboard call`),
#                           libwebrtc-audio-processing for WebRTC's VAD (internal/vad) and its echo
#                           canceller and noise suppressor (internal/apm, a C++ shim: g++),
#                           libspeexdsp for call's resampler (WAV files at 22,050 or 44,100 Hz),
#                           curl and jq (README: minting a client token)
#   scripts/deps.sh test    build + chromium (browser tests) + coturn (relay bench) + espeak-ng
#                           and sox (speech files) + Firefox ESR and GStreamer webrtcbin with
#                           libnice (interop tests, docs/interop.md) + python3-websockets (runs
#                           the Python backend of docs/bridge.md) + nftables (the ICE-TCP browser
#                           tests drop a namespace's UDP) + iptables (internal/testsupport/kube's
#                           check that a node leaves the host's firewall alone)
#   scripts/deps.sh node    test + containerd, runc and the CNI plugins (bridge, host-local,
#                           loopback), dnsmasq (cluster DNS), util-linux's nsenter: the real-node
#                           test (scripts/kube-node.sh, docs/operations.md "A real node")
set -euo pipefail
want=(gcc g++ pkg-config libopus-dev libopusfile-dev libspeexdsp-dev libwebrtc-audio-processing-dev curl jq)
if [[ "${1:-build}" == test || "${1:-build}" == node ]]; then
  want+=(chromium coturn iproute2 nftables iptables redis-server espeak-ng sox firefox-esr python3-websockets
         gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
         gstreamer1.0-nice python3-gi python3-gst-1.0 gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0)
fi
if [[ "${1:-build}" == node ]]; then
  want+=(containerd runc containernetworking-plugins dnsmasq-base util-linux)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
# The Go version go.mod asks for is the minimum; `go env` in the module may
# switch to that toolchain itself (GOTOOLCHAIN=auto) when it can download it.
deps_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
go_need=$(awk '$1 == "go" { print $2; exit }' "$deps_root/go.mod")
command -v go >/dev/null || { echo "Go >= $go_need is required (https://go.dev/doc/install)" >&2; exit 1; }
go_have=$(cd "$deps_root" && go env GOVERSION 2>/dev/null) || go_have=""
go_have=${go_have#go}
if [[ -z "$go_have" ]] || ! printf '%s\n%s\n' "$go_need" "$go_have" | sort -V -C; then
  echo "Go >= $go_need is required, found ${go_have:-an unusable go ($(command -v go))} (https://go.dev/doc/install)" >&2
  exit 1
fi
