package impair

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes datagrams and reports each sender's address.
func echoServer(t *testing.T) (netip.AddrPort, <-chan netip.AddrPort) {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	from := make(chan netip.AddrPort, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, a, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			select {
			case from <- a:
			default:
			}
			_, _ = c.WriteToUDPAddrPort(buf[:n], a)
		}
	}()
	t.Cleanup(func() { _ = c.Close(); <-done })
	return c.LocalAddr().(*net.UDPAddr).AddrPort(), from
}

func client(t *testing.T, to netip.AddrPort) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestUDPDelay(t *testing.T) {
	target, _ := echoServer(t)
	p, err := NewUDP("127.0.0.1:0", target, Config{Delay: 20 * time.Millisecond}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := client(t, p.Addr())
	buf := make([]byte, 64)
	for i := range 5 {
		start := time.Now()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err != nil || n != 1 || buf[0] != byte(i) {
			t.Fatalf("echo %d: %v %x", i, err, buf[:n])
		}
		if rtt := time.Since(start); rtt < 40*time.Millisecond {
			t.Fatalf("round trip %v through a 20 ms each-way proxy", rtt)
		}
	}
}

func TestUDPLossAndDuplicate(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		wantReply int // replies per datagram sent
	}{
		{"all lost", Config{Loss: 1}, 0},
		{"all duplicated", Config{Duplicate: 1}, 4}, // duplicated each way
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, _ := echoServer(t)
			p, err := NewUDP("127.0.0.1:0", target, tt.cfg, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c := client(t, p.Addr())
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			got := 0
			buf := make([]byte, 64)
			for {
				_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				if _, err := c.Read(buf); err != nil {
					break
				}
				got++
			}
			if got != tt.wantReply {
				t.Fatalf("got %d replies, want %d (stats %+v)", got, tt.wantReply, p.Stats())
			}
		})
	}
}

// TestUDPDrop: Config.Drop sees each datagram with its client and
// direction, and a datagram it picks is dropped and counted.
func TestUDPDrop(t *testing.T) {
	target, _ := echoServer(t)
	var mu sync.Mutex
	var seen []string
	cfg := Config{Drop: func(client netip.AddrPort, b []byte, toTarget bool) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%v %s %v", client, b, toTarget))
		return !toTarget && string(b) == "b" // the echo of "b"
	}}
	p, err := NewUDP("127.0.0.1:0", target, cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := client(t, p.Addr())
	var got []string
	buf := make([]byte, 64)
	for _, m := range []string{"a", "b", "c"} {
		if _, err := c.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			got = append(got, string(buf[:n]))
		}
	}
	if strings.Join(got, "") != "ac" {
		t.Fatalf("echoes %q, want a and c", got)
	}
	if st := p.Stats(); st.Dropped != 1 {
		t.Fatalf("dropped %d, want 1", st.Dropped)
	}
	me := c.LocalAddr().(*net.UDPAddr).AddrPort()
	mu.Lock()
	defer mu.Unlock()
	want := []string{me.String() + " a true", me.String() + " a false", me.String() + " b true", me.String() + " b false", me.String() + " c true", me.String() + " c false"}
	if strings.Join(seen, "; ") != strings.Join(want, "; ") {
		t.Fatalf("Drop saw %q, want %q", seen, want)
	}
}

func TestUDPRebind(t *testing.T) {
	target, from := echoServer(t)
	p, err := NewUDP("127.0.0.1:0", target, Config{}, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := client(t, p.Addr())
	buf := make([]byte, 64)
	roundTrip := func() netip.AddrPort {
		t.Helper()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
		return <-from
	}
	first := roundTrip()
	if !p.Rebind(c.LocalAddr().(*net.UDPAddr).AddrPort()) {
		t.Fatal("client unknown to the proxy")
	}
	second := roundTrip()
	if first == second {
		t.Fatalf("target saw the same source %s after a rebinding", first)
	}
}

func TestTCPDelay(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	p, err := NewTCP("127.0.0.1:0", srv.Listener.Addr().String(), 15*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	start := time.Now()
	resp, err := cl.Get("http://" + p.Addr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The connect is not delayed (the proxy accepts locally); the request
	// and the response are: at least one round trip of 30 ms.
	if string(body) != "ok" || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("body %q after %v", body, time.Since(start))
	}
}
