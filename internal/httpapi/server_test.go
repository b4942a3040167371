package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// startServer serves h on a loopback port within lim until the test ends.
func startServer(t *testing.T, lim Limits, h http.Handler, reg prometheus.Registerer, log *slog.Logger) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ln, h, lim, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one request on c and reads its response's status.
func get(c net.Conn, br *bufio.Reader) (int, error) {
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * ReadHeaderTimeout))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// closedBy reports whether the server closed c (EOF or a reset) before
// the deadline.
func closedBy(c net.Conn, deadline time.Time) bool {
	_ = c.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// waitFor polls cond every 10 ms for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
	}
}

// TestPerSource: a source with PerSource connections open has the next
// one closed at once, counted; another source, and an exempt one, are
// served; a closed connection gives its place back.
func TestPerSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := startServer(t, Limits{Name: "signaling", PerSource: 2, Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")}}, ok, reg, nil)
	addr := s.Addr().String()
	a1, a2 := dialFrom(t, "127.0.0.2", addr), dialFrom(t, "127.0.0.2", addr)
	for _, c := range []net.Conn{a1, a2} {
		if st, err := get(c, bufio.NewReader(c)); err != nil || st != http.StatusNoContent {
			t.Fatalf("within the cap: %d %v", st, err)
		}
	}
	a3 := dialFrom(t, "127.0.0.2", addr)
	if !closedBy(a3, time.Now().Add(5*time.Second)) {
		t.Fatal("the third connection of 127.0.0.2 was not closed")
	}
	waitFor(t, "refused counted", func() bool { return s.Stats().Refused == 1 })
	for _, src := range []string{"127.0.0.1", "127.0.0.3", "127.0.0.3", "127.0.0.3"} {
		c := dialFrom(t, src, addr)
		if st, err := get(c, bufio.NewReader(c)); err != nil || st != http.StatusNoContent {
			t.Fatalf("from %s: %d %v", src, st, err)
		}
	}
	a1.Close()
	waitFor(t, "the closed connection's place given back", func() bool { return s.Stats().Open == 5 })
	a4 := dialFrom(t, "127.0.0.2", addr)
	if st, err := get(a4, bufio.NewReader(a4)); err != nil || st != http.StatusNoContent {
		t.Fatalf("after one closed: %d %v", st, err)
	}
	if got := metricValue(t, reg, "switchboard_http_connections_refused_total"); got != 1 {
		t.Fatalf("refused_total %v, want 1", got)
	}
}

// metricValue returns the value of the counter or gauge name in reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			return mf.Metric[0].GetCounter().GetValue() + mf.Metric[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestMaxConnsIdleGivesWay: at MaxConns, a new connection takes the place
// of the connection idle the longest; with none idle (headers still
// coming), it waits until one closes.
func TestMaxConnsIdleGivesWay(t *testing.T) {
	s := startServer(t, Limits{Name: "t", MaxConns: 3}, ok, nil, nil)
	addr := s.Addr().String()
	var idle []net.Conn
	for range 3 {
		c := dialFrom(t, "127.0.0.1", addr)
		if st, err := get(c, bufio.NewReader(c)); err != nil || st != http.StatusNoContent {
			t.Fatalf("%d %v", st, err)
		}
		idle = append(idle, c)
		time.Sleep(5 * time.Millisecond) // distinct idle times
	}
	c := dialFrom(t, "127.0.0.1", addr)
	if st, err := get(c, bufio.NewReader(c)); err != nil || st != http.StatusNoContent {
		t.Fatalf("at the cap with idle connections: %d %v", st, err)
	}
	if !closedBy(idle[0], time.Now().Add(5*time.Second)) {
		t.Fatal("the connection idle the longest was not closed")
	}
	if st := s.Stats(); st.IdleClosed != 1 || st.Open != 3 {
		t.Fatalf("stats %+v, want 1 idle closed and 3 open", st)
	}

	// Three connections busy sending a header: a new one waits.
	for _, c := range idle[1:] {
		c.Close()
	}
	c.Close()
	waitFor(t, "all closed", func() bool { return s.Stats().Open == 0 })
	for range 3 {
		b := dialFrom(t, "127.0.0.1", addr)
		if _, err := io.WriteString(b, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
		defer b.Close()
	}
	waitFor(t, "3 open", func() bool { return s.Stats().Open == 3 })
	w := dialFrom(t, "127.0.0.1", addr) // the kernel completes the handshake; the server does not accept it
	waitFor(t, "an accept waiting", func() bool { return s.Stats().AcceptWaits >= 1 })
	if s.Stats().Open != 3 {
		t.Fatalf("open %d beyond the cap 3", s.Stats().Open)
	}
	// The header timeout frees the busy ones; the waiting one is served.
	if st, err := get(w, bufio.NewReader(w)); err != nil || st != http.StatusNoContent {
		t.Fatalf("the waiting connection: %d %v", st, err)
	}
}

// TestHeaderCap: a header past MaxHeaderBytes gets 431, which reaches the
// client although the server closes the connection with the request
// unread (CloseWrite passed through); one within it is served.
func TestHeaderCap(t *testing.T) {
	s := startServer(t, Limits{Name: "t"}, ok, nil, nil)
	for _, tt := range []struct {
		name   string
		size   int
		status int
	}{
		{"a bearer token and proxy headers", 8 << 10, http.StatusNoContent},
		{"past the cap", MaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := dialFrom(t, "127.0.0.1", s.Addr().String())
			go fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", strings.Repeat("a", tt.size))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

// TestPprofDeadline: a CPU profile of a second is served within the
// server's write deadline, and one asked for longer than WriteTimeout is
// not refused (net/http/pprof refuses a profile longer than the server's
// WriteTimeout; the server sets it per request instead).
func TestPprofDeadline(t *testing.T) {
	mux := http.NewServeMux()
	HandlePprof(mux)
	s := startServer(t, Limits{Name: "ops"}, mux, nil, nil)
	for _, q := range []string{"seconds=1", fmt.Sprintf("seconds=%d", int(WriteTimeout/time.Second)+1)} {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr().String()+"/debug/pprof/profile?"+q, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			if q != "seconds=1" && errors.Is(err, context.DeadlineExceeded) {
				continue // still profiling: not refused
			}
			t.Fatalf("%s: %v", q, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestAcceptOutOfDescriptors runs a server in a child process with 64
// descriptors (this test binary, TestHelperOutOfDescriptors), takes all
// it has left with open files and a client connection waiting in the
// accept queue for 3 s: the server retries the accept with pauses and logs
// it once, not per retry as net/http does; once descriptors are free, the
// waiting connection is served. Its cap is 32 connections (half the
// limit).
func TestAcceptOutOfDescriptors(t *testing.T) {
	if os.Getenv("HTTPAPI_HELPER") != "" {
		t.Skip("in the helper")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOutOfDescriptors$", "-test.v")
	cmd.Env = append(os.Environ(), "HTTPAPI_HELPER=1")
	out, err := cmd.CombinedOutput()
	t.Logf("helper:\n%s", out)
	if err != nil {
		t.Fatalf("helper failed: %v", err)
	}
	for _, want := range []string{"max_conns=32", "served after the descriptors came back"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the helper's output lacks %q", want)
		}
	}
	n := strings.Count(string(out), "http accept failed")
	if n != 1 {
		t.Fatalf("%d log lines of accept failures in 3 s, want 1", n)
	}
	var errs int
	for line := range strings.SplitSeq(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "accept errors: "); ok {
			errs, _ = strconv.Atoi(v)
		}
	}
	// 5 ms doubling to 1 s: about 9 in 3 s; a spinning loop makes thousands.
	if errs < 2 || errs > 20 {
		t.Fatalf("%d failed accepts in 3 s, want a few (paused retries)", errs)
	}
}

// TestHelperOutOfDescriptors is TestAcceptOutOfDescriptors's child.
func TestHelperOutOfDescriptors(t *testing.T) {
	if os.Getenv("HTTPAPI_HELPER") == "" {
		t.Skip("run by TestAcceptOutOfDescriptors")
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 64, Max: 64}); err != nil {
		t.Fatal(err)
	}
	log := &logbuf.Buffer{}
	s := startServer(t, Limits{Name: "t"}, ok, nil, slog.New(slog.NewTextHandler(io.MultiWriter(log, os.Stdout), nil)))
	fmt.Printf("max_conns=%d\n", s.MaxConns())
	var files []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		files = append(files, f)
	}
	// One descriptor for the client's end: the server's end is the one
	// it cannot accept.
	files[len(files)-1].Close()
	files = files[:len(files)-1]
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3 * time.Second)
	fmt.Printf("accept errors: %d\n", s.Stats().AcceptErrors)
	for _, f := range files {
		f.Close()
	}
	if st, err := get(c, bufio.NewReader(c)); err != nil || st != http.StatusNoContent {
		t.Fatalf("after the descriptors came back: %d %v", st, err)
	}
	fmt.Println("served after the descriptors came back")
}
