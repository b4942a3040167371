//go:build unix

package audio

import (
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
