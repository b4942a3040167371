package playout_test

import (
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/playout"
)

// udpSink sends each packet as a datagram to a loopback socket (the cost
// of the real send, minus SRTP) and records when each send began and
// ended.
type udpSink struct {
	conn *net.UDPConn
	mu   sync.Mutex
	gen  byte // payload[0] of the run being played; packets of older runs are "cleared"
	// send start times of the current run
	starts []time.Time
	// the end of the last send of a cleared run's packet
	lastOld time.Time
}

func (s *udpSink) SendPacket(p *playout.Packet) {
	start := time.Now()
	_, _ = s.conn.Write(p.Payload)
	end := time.Now()
	s.mu.Lock()
	if p.Payload[0] == s.gen {
		s.starts = append(s.starts, start)
	} else {
		s.lastOld = end
	}
	s.mu.Unlock()
}

// BenchmarkPacing plays a 5 s burst on every one of N sessions on one
// real clock, each starting at a random moment within the first tick (so
// the runs start at every phase of the tick), then clears each session at a random
// moment of a second burst. It reports the send interval per session (p50, p99, worst, in
// ms; 20 is perfect) and the clear latency (Clear called → the last
// packet of the cleared audio sent, p50 and p99 in µs), and the process's
// CPU time during the first burst per session per 20 ms of audio (the
// clock, the sends, and the loopback receiver draining them). The baseline,
// ticker-per-session, paces the same bursts the naive way: a goroutine and
// a time.Ticker per session. Run it once:
//
//	go test -run '^$' -bench Pacing -benchtime 1x ./internal/playout
func BenchmarkPacing(b *testing.B) {
	for _, n := range []int{100, 200} {
		b.Run("clock/"+sessionsName(n), func(b *testing.B) {
			for b.Loop() {
				pacing(b, n)
			}
		})
		b.Run("ticker-per-session/"+sessionsName(n), func(b *testing.B) {
			for b.Loop() {
				pacingTickers(b, n)
			}
		})
	}
}

// pacingTickers is the baseline: each session's goroutine sends one
// packet per tick of its own time.Ticker.
func pacingTickers(b *testing.B, n int) {
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := sink.Read(buf); err != nil {
				return
			}
		}
	}()
	starts := make([][]time.Time, n)
	cpu0 := processCPU()
	var wg sync.WaitGroup
	for i := range n {
		conn, err := net.DialUDP("udp", nil, sink.LocalAddr().(*net.UDPAddr))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		wg.Go(func() {
			payload := make([]byte, 120)
			time.Sleep(rand.N(playout.Tick)) // a reply starts at any moment
			t := time.NewTicker(playout.Tick)
			defer t.Stop()
			for range 250 {
				<-t.C
				starts[i] = append(starts[i], time.Now())
				_, _ = conn.Write(payload)
			}
		})
	}
	wg.Wait()
	cpu := processCPU() - cpu0
	var intervals []float64
	for _, s := range starts {
		for i := 1; i < len(s); i++ {
			intervals = append(intervals, float64(s[i].Sub(s[i-1]).Microseconds())/1000)
		}
	}
	b.ReportMetric(percentile(intervals, 50), "interval-p50-ms")
	b.ReportMetric(percentile(intervals, 99), "interval-p99-ms")
	b.ReportMetric(percentile(intervals, 100), "interval-max-ms")
	b.ReportMetric(float64(cpu.Microseconds())/250/float64(n), "cpu-µs/session/20ms")
}

func sessionsName(n int) string { return "sessions=" + itoa(n) }

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func pacing(b *testing.B, n int) {
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() { // drain
		buf := make([]byte, 2048)
		for {
			if _, err := sink.Read(buf); err != nil {
				return
			}
		}
	}()
	c, err := playout.NewClock(playout.ClockConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	sinks := make([]*udpSink, n)
	queues := make([]*playout.Queue, n)
	payload := make([]byte, 120) // a 32 kb/s Opus packet
	for i := range n {
		conn, err := net.DialUDP("udp", nil, sink.LocalAddr().(*net.UDPAddr))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		sinks[i] = &udpSink{conn: conn, gen: 1}
		queues[i] = c.NewQueue(sinks[i], playout.QueueConfig{})
	}
	burst := func(q *playout.Queue, gen byte, d time.Duration) {
		payload[0] = gen
		for range int(d / playout.Tick) {
			if err := q.PushAudio(payload, playout.TickSamples); err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu0 := processCPU()
	spreadStarts(n, func(i int) { burst(queues[i], 1, 5*time.Second) })
	time.Sleep(5*time.Second + 200*time.Millisecond)
	cpu := processCPU() - cpu0
	var intervals []float64
	for _, s := range sinks {
		s.mu.Lock()
		for i := 1; i < len(s.starts); i++ {
			intervals = append(intervals, float64(s.starts[i].Sub(s.starts[i-1]).Microseconds())/1000)
		}
		if len(s.starts) != 250 {
			b.Errorf("a session sent %d packets of a 5 s burst, want 250", len(s.starts))
		}
		s.starts = s.starts[:0]
		s.gen = 2
		s.mu.Unlock()
	}
	// Second burst, cleared at a random moment between 0.5 and 1.5 s.
	spreadStarts(n, func(i int) { burst(queues[i], 1, 3*time.Second) })
	clearLat := make([]float64, n)
	var wg sync.WaitGroup
	for i, q := range queues {
		wg.Go(func() {
			time.Sleep(500*time.Millisecond + time.Duration(rand.Int64N(int64(time.Second))))
			t0 := time.Now()
			q.Clear()
			done := time.Now()
			time.Sleep(50 * time.Millisecond) // any send in flight has ended
			s := sinks[i]
			s.mu.Lock()
			if s.lastOld.After(done) {
				done = s.lastOld
			}
			s.mu.Unlock()
			clearLat[i] = float64(done.Sub(t0).Nanoseconds()) / 1000
		})
	}
	wg.Wait()
	b.ReportMetric(percentile(intervals, 50), "interval-p50-ms")
	b.ReportMetric(percentile(intervals, 99), "interval-p99-ms")
	b.ReportMetric(percentile(intervals, 100), "interval-max-ms")
	b.ReportMetric(percentile(clearLat, 50), "clear-p50-µs")
	b.ReportMetric(percentile(clearLat, 99), "clear-p99-µs")
	b.ReportMetric(float64(c.Stats().LateTicks), "late-ticks")
	b.ReportMetric(float64(cpu.Microseconds())/260/float64(n), "cpu-µs/session/20ms")
}

// processCPU returns the CPU time (user + system) the process used so far:
// on a shared machine it does not count the time spent waiting for a core.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}
