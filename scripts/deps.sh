#!/usr/bin/env bash
# Installs the Debian packages Switchboard needs, only those missing.
#   scripts/deps.sh build   libopus for the Opus encoder in `switchboard call`
#   scripts/deps.sh test    build + chromium (browser tests) + coturn (relay bench)
set -euo pipefail
want=(gcc pkg-config libopus-dev libopusfile-dev)
# WebRTC's voice activity detector (internal/vad, through cgo).
want+=(libwebrtc-audio-processing-dev)
if [[ "${1:-build}" == test ]]; then
  want+=(chromium coturn iproute2 redis-server)
fi
# Speech for the VAD and voice tests: espeak-ng speaks, sox converts.
if [[ "${1:-build}" == test ]]; then
  want+=(espeak-ng sox)
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
command -v go >/dev/null || { echo "Go 1.26 is required (https://go.dev/doc/install)" >&2; exit 1; }
