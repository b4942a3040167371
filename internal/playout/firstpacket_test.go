package playout

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// firstSink notes when its queue's first packet was sent.
type firstSink struct{ sent chan time.Time }

func (s *firstSink) SendPacket(*Packet) {
	select {
	case s.sent <- time.Now():
	default:
	}
}

type nopSink struct{}

func (nopSink) SendPacket(*Packet) {}

// BenchmarkFirstPacket measures how long a run's first packet waits
// between PushAudio into an idle queue and its Sink's SendPacket, on a
// real clock whose workers also pace 100 sessions' replies (started at
// random moments, at every phase of the tick). Each round pushes 16
// queues × 8 replies at random moments; it reports the median and p90 in
// µs. Against a tick-aligned start (the half a tick it would wait on
// average) it is docs/benchmarks.md's figure. Run it with, e.g.:
//
//	go test -run '^$' -bench FirstPacket -benchtime 10x ./internal/playout
func BenchmarkFirstPacket(b *testing.B) {
	for _, tick := range []time.Duration{Tick, TickShort} {
		b.Run(tick.String(), func(b *testing.B) {
			var wakes []float64
			for b.Loop() {
				wakes = append(wakes, firstPackets(b, tick)...)
			}
			b.ReportMetric(quantile(wakes, 50), "wake-p50-µs")
			b.ReportMetric(quantile(wakes, 90), "wake-p90-µs")
		})
	}
}

// firstPackets runs one round on a new clock and returns the delays, µs.
func firstPackets(b *testing.B, tick time.Duration) []float64 {
	c, err := NewClock(ClockConfig{Tick: tick})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 120)
	dur := int(c.samples)
	// The load: replies pacing out meanwhile, started at random moments
	// within a tick, so that they start at every phase of it.
	starts := make([]time.Duration, 100)
	for i := range starts {
		starts[i] = rand.N(tick)
	}
	slices.Sort(starts)
	t0 := time.Now()
	for _, d := range starts {
		time.Sleep(time.Until(t0.Add(d)))
		q := c.NewQueue(nopSink{}, QueueConfig{})
		for range int(2 * time.Second / tick) {
			if err := q.PushAudio(payload, dur); err != nil {
				b.Fatal(err)
			}
		}
	}
	const probes, replies = 16, 8
	delays := make([]float64, probes*replies)
	var wg sync.WaitGroup
	for p := range probes {
		wg.Go(func() {
			sink := &firstSink{sent: make(chan time.Time, 1)}
			q := c.NewQueue(sink, QueueConfig{})
			for r := range replies {
				// Idle again (the clear's queue leaves its worker at its
				// next turn), at a random phase of the clock.
				time.Sleep(2*tick + time.Duration(rand.Int64N(int64(2*tick))))
				t0 := time.Now()
				if err := q.PushAudio(payload, dur); err != nil {
					b.Error(err)
					return
				}
				t1 := <-sink.sent
				delays[p*replies+r] = float64(t1.Sub(t0).Nanoseconds()) / 1000
				q.Clear()
			}
		})
	}
	wg.Wait()
	return delays
}

// quantile returns the p-th percentile of v (nearest rank below).
func quantile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(p/100*float64(len(s)-1))]
}
