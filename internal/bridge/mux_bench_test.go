package bridge_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// countingConn counts the Write and Read calls on a connection: each is
// one write(2) or read(2) on the socket.
type countingConn struct {
	net.Conn
	writes, reads *atomic.Uint64
}

func (c countingConn) Write(b []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(b) }
func (c countingConn) Read(b []byte) (int, error)  { c.reads.Add(1); return c.Conn.Read(b) }

// BenchmarkBridge200Sessions sends one 20 ms Opus-sized frame (120 bytes)
// for each of 200 sessions per iteration, from one goroutine as the
// transceiver's playout clock does, and waits until the echo backend has
// sent all 200 back: v1 (one WebSocket per session) against v2 (sessions
// over shared connections, DefaultSessionsPerConn each). It reports
// frames/s (one way) and the transceiver side's write and read calls per
// frame, each one syscall.
func BenchmarkBridge200Sessions(b *testing.B) {
	for _, v := range []string{"v1", "v2"} {
		b.Run(v, func(b *testing.B) {
			var url string
			if v == "v1" {
				url = echoURLV1(b)
			} else {
				url, _ = serveV2(b, echoSession)
			}
			var writes, reads atomic.Uint64
			d := &net.Dialer{}
			client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return countingConn{Conn: c, writes: &writes, reads: &reads}, nil
			}}}
			p := bridge.NewPool(url, bridge.PoolOptions{HTTPClient: client})
			const sessions = 200
			ctx := context.Background()
			cs := make([]*bridge.Conn, sessions)
			for i := range cs {
				c, err := p.Dial(ctx, bridge.SessionStart{SessionID: fmt.Sprint("s", i)})
				if err != nil {
					b.Fatal(err)
				}
				cs[i] = c
			}
			var got atomic.Int64
			tick := make(chan struct{}, 1)
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Go(func() {
					for {
						m, err := c.Recv(ctx)
						if err != nil || m.End != nil {
							return
						}
						if got.Add(1)%sessions == 0 {
							tick <- struct{}{}
						}
					}
				})
			}
			payload := make([]byte, 120)
			w0, r0 := writes.Load(), reads.Load()
			b.ReportAllocs()
			b.ResetTimer()
			n := 0
			for b.Loop() {
				for _, c := range cs {
					if err := c.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(n), Timestamp: uint32(n) * 960, Payload: payload}); err != nil {
						b.Fatal(err)
					}
				}
				<-tick
				n++
			}
			b.StopTimer()
			frames := float64(n * sessions)
			b.ReportMetric(frames/b.Elapsed().Seconds(), "frames/s")
			b.ReportMetric(float64(writes.Load()-w0)/frames, "writes/frame")
			b.ReportMetric(float64(reads.Load()-r0)/frames, "reads/frame")
			b.ReportMetric(0, "ns/op")
			for _, c := range cs {
				_ = c.End(ctx, bridge.ReasonClientHangup)
			}
			wg.Wait()
			_ = p.Close()
		})
	}
}
