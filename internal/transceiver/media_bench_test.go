//go:build unix

package transceiver

import (
	"syscall"
	"testing"
	"time"

	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/audio"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// nopSink takes paced packets and drops them.
type nopSink struct{ n int }

func (s *nopSink) SendPacket(*playout.Packet) { s.n++ }

// BenchmarkMediaPath is the transceiver's own media work per session for
// one 20 ms frame each way, for Opus passthrough and the PCM formats:
//
//   - client → backend: Opus passthrough frames the packet for the bridge;
//     PCM decodes it (audio.Decoder) and frames the PCM;
//   - backend → client: Opus passthrough checks the packet's framing and
//     queues it; PCM frames and encodes the PCM (audio.Encoder) and queues
//     the packet; both are then paced out by a clock tick.
//
// The WebSocket write, SRTP and the UDP send are the same calls for every
// format and are left out (PCM frames are larger on the bridge: 960 bytes
// at 24 kHz against about 100). The "ptime 10" case is PCM at 24 kHz
// with -ptime 10: per 20 ms, two 10 ms client packets decoded into one
// frame, one backend frame encoded into two 10 ms packets, two 10 ms
// ticks (what doubles besides, SRTP and the sends per packet, is left out
// as for every case). Compare the sub-benchmarks of one run:
//
//	go test -run '^$' -bench MediaPath -count 5 ./internal/transceiver
func BenchmarkMediaPath(b *testing.B) {
	w, err := callclient.LoadWAV("../../testdata/speech.wav")
	if err != nil {
		b.Fatal(err)
	}
	enc, _ := opus.NewEncoder(48000, 1, opus.AppVoIP)
	_ = enc.SetInBandFEC(true)
	var client [][]byte // the browser's packets
	buf := make([]byte, 1275)
	for i := 0; i+960 <= len(w.Samples); i += 960 {
		n, _ := enc.Encode(w.Samples[i:i+960], buf)
		client = append(client, append([]byte(nil), buf[:n]...))
	}
	var client10 [][]byte // the same speech in 10 ms packets, two per 20 ms
	for i := 0; i+480 <= len(w.Samples); i += 480 {
		n, _ := enc.Encode(w.Samples[i:i+480], buf)
		client10 = append(client10, append([]byte(nil), buf[:n]...))
	}
	for _, tc := range []struct {
		name, format string
		ptime        int
	}{
		{bridge.FormatOpus, bridge.FormatOpus, 20},
		{bridge.FormatPCM24k, bridge.FormatPCM24k, 20},
		{bridge.FormatPCM16k, bridge.FormatPCM16k, 20},
		{bridge.FormatPCM24k + " ptime 10", bridge.FormatPCM24k, 10},
	} {
		format, per := tc.format, 20/tc.ptime // packets per 20 ms
		b.Run(tc.name, func(b *testing.B) {
			rate := bridge.SampleRate(format)
			var dec *audio.Decoder
			var pcmEnc *audio.Encoder
			var backend [][]byte // what the backend sends: Opus packets, or PCM frames
			if rate == 0 {
				backend = client
			} else {
				dec, _ = audio.NewDecoder(rate)
				pcmEnc, _ = audio.NewEncoderConfig(audio.EncoderConfig{Rate: rate, FrameMs: tc.ptime})
				d, _ := audio.NewDecoder(rate)
				for i, p := range client {
					for _, f := range d.Push(uint16(i), uint32(i*960), p) {
						backend = append(backend, append([]byte(nil), f.PCM...))
					}
				}
			}
			clock, err := playout.NewManualClock(1, time.Duration(tc.ptime)*time.Millisecond)
			if err != nil {
				b.Fatal(err)
			}
			q := clock.NewQueue(&nopSink{}, playout.QueueConfig{})
			wire := make([]byte, 0, 2048)
			b.ReportAllocs()
			i := 0
			cpu0 := processCPU()
			for b.Loop() {
				// client → backend
				switch {
				case dec == nil:
					wire = bridge.AppendAudioFrame(wire[:0], bridge.AudioFrame{Seq: uint16(i), Timestamp: uint32(i * 960), Payload: client[i%len(client)]})
				case per == 1:
					for _, f := range dec.Push(uint16(i), uint32(i*960), client[i%len(client)]) {
						wire = bridge.AppendAudioFrame(wire[:0], bridge.AudioFrame{Seq: f.Seq, Timestamp: f.Timestamp, Payload: f.PCM})
					}
				default:
					for k := range per {
						j := per*i + k
						for _, f := range dec.Push(uint16(j), uint32(j*480), client10[j%len(client10)]) {
							wire = bridge.AppendAudioFrame(wire[:0], bridge.AudioFrame{Seq: f.Seq, Timestamp: f.Timestamp, Payload: f.PCM})
						}
					}
				}
				// backend → client
				in := backend[i%len(backend)]
				if pcmEnc == nil {
					dur, _ := audio.PacketDuration(in)
					_ = q.PushAudio(in, dur)
				} else {
					pkts, _ := pcmEnc.Write(in)
					for _, op := range pkts {
						_ = q.PushAudio(op.Payload, playout.TickSamples/per)
					}
				}
				for k := range per {
					clock.RunTick(int64(1000 + per*i + k))
				}
				i++
			}
			// CPU time, not wall time: on a shared machine it does not count
			// the time the benchmark waited for a core.
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/1000/float64(b.N), "cpu-µs/20ms")
		})
	}
}

// processCPU returns the CPU time (user + system) the process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestMediaPathAllocs: decoding a client packet into PCM frames, encoding
// a backend PCM frame, queueing it and pacing it out allocate nothing in
// the steady state.
func TestMediaPathAllocs(t *testing.T) {
	w, err := callclient.LoadWAV("../../testdata/speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := opus.NewEncoder(48000, 1, opus.AppVoIP)
	buf := make([]byte, 1275)
	var client [][]byte
	for i := 0; i+960 <= len(w.Samples) && len(client) < 50; i += 960 {
		n, _ := enc.Encode(w.Samples[i:i+960], buf)
		client = append(client, append([]byte(nil), buf[:n]...))
	}
	dec, _ := audio.NewDecoder(24000)
	pcmEnc, _ := audio.NewEncoder(24000, 0)
	clock, err := playout.NewManualClock(1, playout.Tick)
	if err != nil {
		t.Fatal(err)
	}
	sink := &nopSink{}
	q := clock.NewQueue(sink, playout.QueueConfig{})
	wire := make([]byte, 0, 2048)
	var evs []playout.Event
	i := 0
	step := func() {
		for _, f := range dec.Push(uint16(i), uint32(i*960), client[i%len(client)]) {
			wire = bridge.AppendAudioFrame(wire[:0], bridge.AudioFrame{Seq: f.Seq, Timestamp: f.Timestamp, Payload: f.PCM, Concealed: f.Concealed})
			pkts, _ := pcmEnc.Write(f.PCM) // the echo: the same frame back
			for _, p := range pkts {
				_ = q.PushAudio(p.Payload, playout.TickSamples)
			}
		}
		clock.RunTick(int64(1000 + i))
		evs = q.Events(evs[:0])
		i++
	}
	for range 20 {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("PCM media path per frame: %v allocations, want 0", n)
	}
	if sink.n < 200 {
		t.Fatalf("%d packets paced out", sink.n)
	}
}
