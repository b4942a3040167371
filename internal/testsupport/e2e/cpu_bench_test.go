//go:build unix

package e2e

import (
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/switchboard-rtc/switchboard/internal/agent"
	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

// BenchmarkSessionCPU runs 10 calls at once, each 4 s of speech from a
// Pion client through the relay and the transceiver to the echo agent and
// back, with the echo in Opus (passthrough) or in PCM (decode, encode,
// pace), and reports the CPU time of the whole process (clients, relay,
// transceiver, agent) per 20 ms frame echoed: the PCM cost is the
// difference between the formats, since everything else is the same.
//
//	go test -run '^$' -bench SessionCPU -benchtime 1x -count 3 ./internal/e2e
func BenchmarkSessionCPU(b *testing.B) {
	w, err := callclient.LoadWAV(speech)
	if err != nil {
		b.Fatal(err)
	}
	enc, _ := opus.NewEncoder(48000, 1, opus.AppVoIP)
	_ = enc.SetInBandFEC(true)
	var pkts [][]byte
	buf := make([]byte, 1275)
	for len(pkts) < 200 {
		for i := 0; i+960 <= len(w.Samples) && len(pkts) < 200; i += 960 {
			n, _ := enc.Encode(w.Samples[i:i+960], buf)
			pkts = append(pkts, append([]byte(nil), buf[:n]...))
		}
	}
	const sessions = 10
	for _, format := range []string{bridge.FormatOpus, bridge.FormatPCM24k} {
		b.Run(format, func(b *testing.B) {
			for b.Loop() {
				echo, _ := agent.NewEchoConfig(agent.EchoConfig{Logger: slog.New(slog.DiscardHandler), Format: format})
				s := startPCMStack(b, echo, nil)
				clients := make([]*testClient, sessions)
				for i := range clients {
					clients[i] = dialClient(b, s.calls)
				}
				time.Sleep(200 * time.Millisecond) // setup work settles
				cpu0 := processCPU()
				var wg sync.WaitGroup
				for _, c := range clients {
					wg.Go(func() {
						tick := time.NewTicker(20 * time.Millisecond)
						defer tick.Stop()
						for _, p := range pkts {
							_ = c.track.WriteSample(media.Sample{Data: p, Duration: 20 * time.Millisecond})
							<-tick.C
						}
					})
				}
				wg.Wait()
				time.Sleep(300 * time.Millisecond) // the last echoes come back
				cpu := processCPU() - cpu0
				got := 0
				for _, c := range clients {
					got += len(c.received())
				}
				if got < sessions*len(pkts)*9/10 {
					b.Fatalf("%d frames echoed of %d", got, sessions*len(pkts))
				}
				b.ReportMetric(float64(cpu.Microseconds())/float64(got), "cpu-µs/frame")
				b.ReportMetric(cpu.Seconds()/(float64(len(pkts))*0.02)/sessions*100, "%core/session")
			}
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
