package playout_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/playout"
)

type discard struct{}

func (discard) SendPacket(*playout.Packet) {}

// BenchmarkClockCPU measures what the clock itself costs: the process's
// CPU time while a real clock (two workers) paces N sessions' replies to
// Sinks that discard them, 2 s per run, in µs per 20 ms of audio (all
// sessions together). The replies start at random moments within a tick
// (spreadStarts), as real ones do, so the runs fall at every phase of the tick. N = 0
// is an idle clock. Run it with:
//
//	go test -run '^$' -bench ClockCPU -benchtime 1x ./internal/playout
func BenchmarkClockCPU(b *testing.B) {
	for _, n := range []int{0, 100, 400} {
		b.Run(sessionsName(n), func(b *testing.B) {
			for b.Loop() {
				c, err := playout.NewClock(playout.ClockConfig{Workers: 2})
				if err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 120)
				queues := make([]*playout.Queue, n)
				for i := range queues {
					queues[i] = c.NewQueue(discard{}, playout.QueueConfig{})
				}
				spreadStarts(n, func(i int) {
					for range 110 { // 2.2 s
						if err := queues[i].PushAudio(payload, playout.TickSamples); err != nil {
							b.Fatal(err)
						}
					}
				})
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

// spreadStarts calls start(i) for each i in [0, n) at a random moment
// within one Tick from now (in the order of those moments, on the
// caller's goroutine): replies begin at any moment, so their runs start
// at every phase of the clock's tick, as on a real transceiver, not all
// at one.
func spreadStarts(n int, start func(i int)) {
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = rand.N(playout.Tick)
	}
	slices.Sort(at)
	t0 := time.Now()
	for i, d := range at {
		time.Sleep(time.Until(t0.Add(d)))
		start(i)
	}
}
