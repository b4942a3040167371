package relaybench

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// Payload layout of every benchmark datagram (after any hop header or
// TURN ChannelData header):
//
//	0     0x80 (RTP version 2, so the relay classifies it as media)
//	1     111 (payload type)
//	2-3   sequence
//	4-7   session index
//	8-15  client send time, ns on the load generator's monotonic clock
//	16-23 sink send time (the echo), same clock
//	24-27 client IPv4 address  } read by the raw ceiling loop to
//	28-29 client UDP port      } return the echo without a lookup
//	30-   zero fill, to 120-200 bytes in all
const (
	offSeq     = 2
	offSession = 4
	offTClient = 8
	offTSink   = 16
	offClient  = 24
	minPayload = 30
)

// Serve runs one Go system under test until stdin reaches EOF (the parent
// closes it) or ctx ends. It prints "READY <public> <internal>" once
// listening. args: -system raw|relay|naive, -sink, -secret, -batch (raw,
// relay), -lock (raw).
func Serve(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	system := fs.String("system", "", "raw, relay or naive")
	sink := fs.String("sink", "", "the sink's (fake transceiver's) UDP address")
	secret := fs.String("secret", "", "token fleet secret, hex (relay)")
	batch := fs.Int("batch", relay.DefaultBatch, "datagrams per recvmmsg/sendmmsg (raw, relay)")
	lock := fs.Bool("lock", true, "runtime.LockOSThread in the read loops (raw; the relay's are always pinned)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sinkAddr, err := netip.ParseAddrPort(*sink)
	if err != nil {
		return fmt.Errorf("-sink: %w", err)
	}
	var pub, internal netip.AddrPort
	var closer io.Closer
	switch *system {
	case "raw":
		r, err := startRaw(sinkAddr, *batch, *lock)
		if err != nil {
			return err
		}
		pub, internal, closer = r.pubAddr, r.intAddr, r
	case "relay":
		sec, err := hex.DecodeString(*secret)
		if err != nil {
			return fmt.Errorf("-secret: %w", err)
		}
		keys, err := token.NewKeyring(token.Key{ID: 1, Secret: sec})
		if err != nil {
			return err
		}
		members, err := membership.NewTable(map[uint32]netip.AddrPort{benchTransceiver: sinkAddr})
		if err != nil {
			return err
		}
		r, err := relay.New(relay.Config{
			PublicAddr: "127.0.0.1:0", InternalAddr: "127.0.0.1:0", Cluster: benchCluster,
			Workers: runtime.GOMAXPROCS(0), Batch: *batch,
		}, keys, members, nil, nil)
		if err != nil {
			return err
		}
		pub, internal, closer = r.PublicAddr(), r.InternalAddr(), r
	case "naive":
		n, err := startNaive(sinkAddr)
		if err != nil {
			return err
		}
		pub, internal, closer = n.addr, n.addr, n
	default:
		return fmt.Errorf("-system %q: want raw, relay or naive", *system)
	}
	defer closer.Close()
	fmt.Fprintf(stdout, "READY %s %s\n", pub, internal)
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

const (
	benchCluster     = 1
	benchTransceiver = 1
)

// rawLoop is the raw ceiling: the relay's socket layout and batched I/O
// with no classification, no flow lookup and no header. Client datagrams
// go verbatim to the sink; the sink's echoes go to the client address
// carried at a fixed offset of the payload.
type rawLoop struct {
	pub, internal    *net.UDPConn
	pubAddr, intAddr netip.AddrPort
	wg               sync.WaitGroup
}

func startRaw(sink netip.AddrPort, batch int, lock bool) (*rawLoop, error) {
	r := &rawLoop{}
	var err error
	if r.pub, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		return nil, err
	}
	if r.internal, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		r.pub.Close()
		return nil, err
	}
	for _, c := range []*net.UDPConn{r.pub, r.internal} {
		_ = c.SetReadBuffer(4 << 20)
		_ = c.SetWriteBuffer(4 << 20)
	}
	r.pubAddr = r.pub.LocalAddr().(*net.UDPAddr).AddrPort()
	r.intAddr = r.internal.LocalAddr().(*net.UDPAddr).AddrPort()
	loop := func(in, out *net.UDPConn, dst func(b []byte) netip.AddrPort) error {
		bufs := make([][]byte, batch)
		for i := range bufs {
			bufs[i] = make([]byte, 2048)
		}
		rb, err := udpio.NewBatch(in, batch, bufs)
		if err != nil {
			return err
		}
		wb, err := udpio.NewBatch(out, batch, nil)
		if err != nil {
			return err
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if lock {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			for {
				n, err := rb.Read()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				for i := range n {
					b := bufs[i][:rb.Len(i)]
					wb.Queue(b, dst(b), len(b))
				}
				if _, _, _, err := wb.Flush(); errors.Is(err, net.ErrClosed) {
					return
				}
			}
		}()
		return nil
	}
	if err := loop(r.pub, r.internal, func([]byte) netip.AddrPort { return sink }); err != nil {
		r.Close()
		return nil, err
	}
	if err := loop(r.internal, r.pub, func(b []byte) netip.AddrPort {
		if len(b) < minPayload {
			return sink // not ours: anything unroutable
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[offClient:offClient+4])), binary.BigEndian.Uint16(b[offClient+4:]))
	}); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *rawLoop) Close() error {
	r.pub.Close()
	r.internal.Close()
	r.wg.Wait()
	return nil
}

// naiveProxy is what a first attempt looks like: one socket, one goroutine,
// ReadFromUDP and WriteToUDP, a mutex-guarded map of clients, and a fresh
// slice for each header. It speaks the same internal hop as the relay.
type naiveProxy struct {
	c    *net.UDPConn
	addr netip.AddrPort
	done chan struct{}
}

func startNaive(sink netip.AddrPort) (*naiveProxy, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	_ = c.SetReadBuffer(4 << 20)
	_ = c.SetWriteBuffer(4 << 20)
	p := &naiveProxy{c: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), done: make(chan struct{})}
	sinkUDP := net.UDPAddrFromAddrPort(sink)
	go func() {
		defer close(p.done)
		var mu sync.Mutex
		clients := map[string]*net.UDPAddr{}
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if ap := from.AddrPort(); netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) == sink {
				_, client, payload, err := hop.ParseHeader(buf[:n])
				if err != nil {
					continue
				}
				mu.Lock()
				to, ok := clients[client.String()]
				mu.Unlock()
				if ok {
					_, _ = c.WriteToUDP(payload, to)
				}
				continue
			}
			mu.Lock()
			if _, ok := clients[from.String()]; !ok {
				clients[from.String()] = from
			}
			mu.Unlock()
			out := hop.AppendHeader(nil, hop.TypeData, from.AddrPort())
			out = append(out, buf[:n]...)
			_, _ = c.WriteToUDP(out, sinkUDP)
		}
	}()
	return p, nil
}

func (p *naiveProxy) Close() error {
	err := p.c.Close()
	<-p.done
	return err
}
