package vad

import (
	"encoding/binary"
	"fmt"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/speech"
	"testing"

	"gopkg.in/hraban/opus.v2"
)

// throughOpus encodes pcm (PCM16 mono at rate) as a WebRTC client would,
// Opus VoIP in packets of packetMs at bitrate, and decodes it at the same
// rate, as the transceiver does before turn detection.
func throughOpus(t testing.TB, rate, bitrate, packetMs int, pcm []byte) []byte {
	t.Helper()
	enc, err := opus.NewEncoder(rate, 1, opus.AppVoIP)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.SetBitrate(bitrate); err != nil {
		t.Fatal(err)
	}
	dec, err := opus.NewDecoder(rate, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := rate * packetMs / 1000
	in := make([]int16, n)
	out := make([]int16, n)
	pkt := make([]byte, 1500)
	res := make([]byte, 0, len(pcm))
	for off := 0; off+2*n <= len(pcm); off += 2 * n {
		for i := range in {
			in[i] = int16(binary.LittleEndian.Uint16(pcm[off+2*i:]))
		}
		m, err := enc.Encode(in, pkt)
		if err != nil {
			t.Fatal(err)
		}
		k, err := dec.Decode(pkt[:m], out)
		if err != nil || k != n {
			t.Fatalf("decode: %d samples, %v", k, err)
		}
		for _, v := range out {
			res = binary.LittleEndian.AppendUint16(res, uint16(v))
		}
	}
	return res
}

// opusEndSlackMs is how much later a speech end may be reported through
// Opus than in the clean audio: the codec's look-ahead (6.5 ms in
// libopus's default mode) and the ringing of its last frame after the
// truth.
const opusEndSlackMs = 20

// TestAccuracyThroughOpus runs part of the accuracy test on audio that
// went through Opus at a low WebRTC bitrate (32 kbit/s), as the
// detector sees it behind the transceiver's decoder: the same bounds
// hold. It runs with the client's packets of 20 ms and 10 ms (the
// transceiver's -ptime 10) and the detector's frames of 20 and 10 ms.
func TestAccuracyThroughOpus(t *testing.T) {
	speech.Require(t)
	if testing.Short() {
		t.Skip("generates minutes of audio")
	}
	const bitrate = 32000
	for _, c := range []struct{ packetMs, fm int }{{20, Frame20ms}, {20, Frame10ms}, {10, Frame10ms}} {
		for _, rate := range []int{Rate16k, Rate24k} {
			st := &accuracyStats{}
			t.Run(fmt.Sprintf("packets%dms/frames%dms/%d", c.packetMs, c.fm, rate), func(t *testing.T) {
				t.Run("silence", func(t *testing.T) {
					t.Parallel()
					sc := makeScene(t, rate, nil)
					sc.pcm = throughOpus(t, rate, bitrate, c.packetMs, sc.pcm)
					sc.endSlackMs = opusEndSlackMs
					checkScene(t, sc, c.fm, st)
				})
				for _, k := range noiseKinds {
					t.Run(k.name+"0", func(t *testing.T) {
						t.Parallel()
						sc := makeScene(t, rate, func(n int) []float64 { return k.noise(t, rate, n, 0) })
						sc.pcm = throughOpus(t, rate, bitrate, c.packetMs, sc.pcm)
						sc.endSlackMs = opusEndSlackMs
						checkScene(t, sc, c.fm, st)
					})
					t.Run(k.name+"0_alone", func(t *testing.T) {
						t.Parallel()
						evs, _ := run(t, rate, c.fm, throughOpus(t, rate, bitrate, c.packetMs, toPCM(k.noise(t, rate, 60*rate, 0))))
						if len(evs) != 0 {
							t.Errorf("%d events on 60 s of noise alone, want none: %v", len(evs), evs)
						}
					})
				}
			})
			if len(st.onsetErr) > 0 {
				t.Logf("%d ms packets, %d ms frames, %d Hz through Opus: %d onsets: |onset error| p50 %d ms, max %d ms; start reported after the true onset p50 %d ms, max %d ms; speech end error p50 %d ms",
					c.packetMs, c.fm, rate, len(st.onsetErr), pct(st.onsetErr, 50), maxOf(st.onsetErr), pct(st.latency, 50), maxOf(st.latency), pct(st.endErr, 50))
			}
		}
	}
}

func maxOf(v []int64) int64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
