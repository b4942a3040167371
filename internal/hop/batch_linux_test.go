package hop

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time, user and system, in ns.
func threadCPU() int64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkWriteRTP is the hop socket's cost per paced RTP packet (160
// bytes, about a 20 ms Opus frame after SRTP) written to 200 clients:
// one sendto each (immediate), or queued between Hold and Flush, a tick
// of 200 packets per Flush (held). The relay side drains on another
// goroutine. cpu-ns/op is the writing thread's own CPU time (user and
// system, which includes the kernel's loopback delivery), steadier than
// ns/op on a busy machine.
//
//	go test -run '^$' -bench WriteRTP -count 5 ./internal/hop
func BenchmarkWriteRTP(b *testing.B) {
	for _, held := range []bool{false, true} {
		name := "immediate"
		if held {
			name = "held"
		}
		b.Run(name, func(b *testing.B) {
			t := &testing.T{}
			r := newBatchRig(t, 200, nil)
			if t.Failed() {
				b.Fatal("rig setup failed")
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]byte, 1600)
				for {
					if _, _, err := r.relay.ReadFromUDPAddrPort(buf); err != nil {
						return
					}
				}
			}()
			pkt := rtpPacket(1, 1)
			pkt = append(pkt, make([]byte, 140)...)
			b.ReportAllocs()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU()
			i := 0
			for b.Loop() {
				if held && i%200 == 0 {
					r.c.Hold()
				}
				if _, err := r.c.WriteToAddrPort(pkt, r.clients[i%200]); err != nil {
					b.Fatal(err)
				}
				i++
				if held && i%200 == 0 {
					r.c.Flush()
				}
			}
			if held && i%200 != 0 {
				r.c.Flush()
			}
			b.StopTimer()
			b.ReportMetric(float64(threadCPU()-cpu0)/float64(i), "cpu-ns/op")
			_ = r.c.Close()
			_ = r.relay.Close()
			<-done
		})
	}
}
