//go:build unix

package audio

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDecode is the client → backend cost of a PCM session per 20 ms
// packet: Opus decode at 24 kHz into a PCM16 frame.
func BenchmarkDecode(b *testing.B) {
	pkts := clientPackets(b, speech(b))
	d, _ := NewDecoder(24000)
	b.ReportAllocs()
	i := 0
	cpu0 := processCPU()
	for b.Loop() {
		d.Push(uint16(i), uint32(i*960), pkts[i%len(pkts)])
		i++
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/1000/float64(b.N), "cpu-µs/frame")
}

// BenchmarkEncode is the backend → client codec cost of a PCM session per
// 20 ms frame: framing and Opus encode from 24 kHz PCM16.
func BenchmarkEncode(b *testing.B) {
	pkts := clientPackets(b, speech(b))
	d, _ := NewDecoder(24000)
	var frames [][]byte
	for i, p := range pkts {
		for _, f := range d.Push(uint16(i), uint32(i*960), p) {
			frames = append(frames, append([]byte(nil), f.PCM...))
		}
	}
	e, _ := NewEncoder(24000, 0)
	benchmarkEncoder(b, e, frames)
}

// BenchmarkEncodeComplexity is BenchmarkEncode's cost at each complexity,
// on the speech a PCM backend sends (24 kHz): the CPU column of
// docs/benchmarks.md "Opus encoder complexity".
func BenchmarkEncodeComplexity(b *testing.B) {
	_, frames := backendSpeech(b)
	for _, c := range complexities {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			e, err := NewEncoderConfig(EncoderConfig{Rate: 24000, Complexity: c})
			if err != nil {
				b.Fatal(err)
			}
			benchmarkEncoder(b, e, frames)
		})
	}
}

// benchmarkEncoder writes frames to e, one 20 ms frame an iteration, and
// reports the process's CPU time per frame.
func benchmarkEncoder(b *testing.B, e *Encoder, frames [][]byte) {
	b.ReportAllocs()
	i := 0
	cpu0 := processCPU()
	for b.Loop() {
		_, _ = e.Write(frames[i%len(frames)])
		i++
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/1000/float64(b.N), "cpu-µs/frame")
}

// processCPU returns the CPU time (user + system) the process used so far:
// on a shared machine, unlike wall time, it does not count waiting for a
// core.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
