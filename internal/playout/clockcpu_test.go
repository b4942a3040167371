package playout_test

import (
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/playout"
)

type discard struct{}

func (discard) SendPacket(*playout.Packet) {}

// BenchmarkClockCPU measures what the clock itself costs: the process's
// CPU time while a real clock (two workers) paces N sessions' replies to
// Sinks that discard them, 2 s per run, in µs per 20 ms of audio (all
// sessions together). N = 0 is an idle clock. Run it with:
//
//	go test -run '^$' -bench ClockCPU -benchtime 1x ./internal/playout
func BenchmarkClockCPU(b *testing.B) {
	for _, n := range []int{0, 100, 400} {
		b.Run(sessionsName(n), func(b *testing.B) {
			for b.Loop() {
				c := playout.NewClock(2)
				payload := make([]byte, 120)
				for range n {
					q := c.NewQueue(discard{}, playout.QueueConfig{})
					for range 110 { // 2.2 s
						if err := q.PushAudio(payload, playout.TickSamples); err != nil {
							b.Fatal(err)
						}
					}
				}
				time.Sleep(100 * time.Millisecond)
				cpu0 := processCPU()
				time.Sleep(2 * time.Second)
				cpu := processCPU() - cpu0
				c.Close()
				b.ReportMetric(float64(cpu.Microseconds())/100, "cpu-µs/20ms")
			}
		})
	}
}
