# syntax=docker/dockerfile:1
#
# One small image with the static switchboard binary and every subcommand
# (demo, relay, transceiver, agent, director, call); the benchmarks are a
# separate tool (cmd/switchboard-bench) and are not in the image:
#
#   docker build -t switchboard .
#   docker run --rm switchboard relay -h
#   docker build --build-arg VERSION=v1.2.3 -t switchboard:v1.2.3 .   # what `switchboard version` prints
#
# The transceiver (PCM bridge formats: internal/audio) and `switchboard
# call` code Opus through libopus, turn detection (internal/vad) runs
# WebRTC's VAD from libwebrtc-audio-processing, input cleaning
# (internal/apm) its echo canceller and noise suppressor through a C++
# shim (libstdc++, linked statically as well), and `call` resamples WAV
# files through libspeexdsp (all cgo), so the binary is built with cgo and
# linked statically against Debian's libopus.a, libwebrtc_audio_processing.a
# and libspeexdsp.a (and libm, which they need); the
# nolibopusfile tag leaves out the Ogg-file reader, which nothing uses.
# netgo and osusergo keep glibc's resolver and user lookup (which cannot be
# linked statically) out of the binary.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libopus-dev libspeexdsp-dev libwebrtc-audio-processing-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# What `switchboard version` prints (docker build --build-arg VERSION=v1.2.3);
# -buildvcs=false leaves the commit out, as the build context has no .git.
ARG VERSION=dev
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -buildvcs=false \
      -tags 'nolibopusfile netgo osusergo' \
      -ldflags "-s -w -X main.version=${VERSION} -linkmode external -extldflags '-static -lm'" \
      -o /out/switchboard ./cmd/switchboard \
 && /out/switchboard -h 2>&1 | grep -q 'Commands:' \
 && ! ldd /out/switchboard >/dev/null 2>&1

# distroless/static: CA certificates, tzdata, /etc/passwd with "nonroot"
# (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/switchboard /usr/local/bin/switchboard
# 3.5 s of speech for `switchboard call` in the cluster (the smoke test of
# docs/operations.md: call URL -audio /usr/share/switchboard/speech.wav).
COPY --from=build /src/testdata/speech.wav /usr/share/switchboard/speech.wav
USER 65532:65532
# 3478/udp relay VIP, 3479/udp relay internal hop, 4000/udp transceiver hop,
# 8080 signaling, 8081 agent, 8443 director, 9090 relay metrics.
EXPOSE 3478/udp 3479/udp 4000/udp 8080 8081 8443 9090
ENTRYPOINT ["switchboard"]
CMD ["-h"]
