package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/httpapi"
)

// These tests hold the HTTP servers of the real binary to the bounds
// docs/security.md ("HTTP servers") documents, with the floods of issue
// 28. SWITCHBOARD_TEST_BIN runs them against another build (one from
// before a change, for its figures); otherwise the binary is built from
// this package.

// testBinary returns the binary under test, built once for the tests
// that share it (removed by TestMain).
func testBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and floods its servers")
	}
	if bin := os.Getenv("SWITCHBOARD_TEST_BIN"); bin != "" {
		return bin
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "switchboard-test-bin")
		if err != nil {
			built.err = err
			return
		}
		built.dir, built.bin = dir, filepath.Join(dir, "switchboard")
		if out, err := exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// built is the binary testBinary built.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

// removeBuilt removes the binary testBinary built, if any.
func removeBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// httpServer is one HTTP server of the binary, running.
type httpServer struct {
	name, addr string
	proc       *child
}

// startHTTPServers starts every server of the binary that serves HTTP, on
// loopback port 0, and returns them once each logged its address.
func startHTTPServers(t *testing.T, bin string) []httpServer {
	t.Helper()
	keyEnv := []string{"SWITCHBOARD_TOKEN_KEY=c3dpdGNoYm9hcmQtdGVzdC1mbGVldC1rZXktMzItYnl0ZXM="}
	directorYAML := filepath.Join(t.TempDir(), "director.yaml")
	if err := os.WriteFile(directorYAML, []byte("default_region: a\nregions: {a: {cluster: c}}\nclusters: {c: [\"http://127.0.0.1:1\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var servers []httpServer
	for _, s := range []struct {
		name      string
		env, args []string
		msg, key  string
	}{
		{"agent", nil, []string{"agent", "-mode", "echo", "-listen", "127.0.0.1:0"}, "http listening", "addr"},
		{"transceiver", keyEnv, []string{"transceiver", "-id", "7", "-listen", "127.0.0.1:0", "-advertise", "127.0.0.1:3478",
			"-backend", "ws://127.0.0.1:1/v1/bridge", "-http", "127.0.0.1:0"}, "transceiver running", "http"},
		{"relay metrics", keyEnv, []string{"relay", "-public", "127.0.0.1:0", "-internal", "127.0.0.1:0", "-members", "7=127.0.0.1:1",
			"-metrics", "127.0.0.1:0"}, "http listening", "addr"},
		{"director", nil, []string{"director", "-config", directorYAML, "-listen", "127.0.0.1:0"}, "http listening", "addr"},
		{"demo", nil, []string{"demo", "-mode", "echo", "-http", "127.0.0.1:0", "-relay", "127.0.0.1:0", "-log-format", "json"}, "switchboard demo running", "web"},
	} {
		c := startChild(t, bin, s.env, s.args...)
		a, busy := c.bound(t, s.msg, s.key)
		if busy {
			t.Fatalf("%s: an address in use, with port 0", s.name)
		}
		servers = append(servers, httpServer{s.name, strings.TrimPrefix(a[0], "http://"), c})
	}
	for _, s := range servers {
		waitHTTP(t, "http://"+s.addr+"/live")
	}
	return servers
}

// TestHTTPBoundsPerServer: on every HTTP server of the binary, a
// keep-alive connection left idle after a request, a request whose
// header trickles in and one whose body does are each closed within the
// bound documented for it (httpapi: IdleTimeout, ReadHeaderTimeout,
// ReadTimeout), plus a margin for a loaded machine.
func TestHTTPBoundsPerServer(t *testing.T) {
	t.Parallel() // mostly waiting for the bounds
	bin := testBinary(t)
	servers := startHTTPServers(t, bin)
	const margin = 3 * time.Second
	probes := []struct {
		name  string
		bound time.Duration
		run   func(c net.Conn) error // runs until the server closes c, or fails
	}{
		{"idle keep-alive", httpapi.IdleTimeout, func(c net.Conn) error {
			br := bufio.NewReader(c)
			if _, err := io.WriteString(c, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.Header.Get("Connection") == "close" {
				return errors.New("the server did not keep the connection alive")
			}
			_, err = io.Copy(io.Discard, br)
			return err
		}},
		{"header one byte a second", httpapi.ReadHeaderTimeout, func(c net.Conn) error {
			return trickle(c, "GET /live HTTP/1.1\r\nHost: x\r\n", "X-Slow: "+strings.Repeat("a", 100))
		}},
		{"body one byte a second", httpapi.ReadTimeout, func(c net.Conn) error {
			return trickle(c, "POST /live HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\nContent-Length: 1000\r\n\r\n", strings.Repeat("v", 1000))
		}},
	}
	var wg sync.WaitGroup
	for _, s := range servers {
		for _, p := range probes {
			wg.Go(func() {
				c, err := net.Dial("tcp", s.addr)
				if err != nil {
					t.Errorf("%s, %s: %v", s.name, p.name, err)
					return
				}
				defer c.Close()
				start := time.Now()
				limit := start.Add(p.bound + margin)
				_ = c.SetDeadline(limit)
				err = p.run(c)
				took := time.Since(start)
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout():
					t.Errorf("%s, %s: still open after %v (bound %v)", s.name, p.name, took.Round(time.Millisecond), p.bound)
				case err != nil && !isClosed(err):
					t.Errorf("%s, %s: %v", s.name, p.name, err)
				default:
					t.Logf("%s, %s: closed by the server after %v (bound %v)", s.name, p.name, took.Round(10*time.Millisecond), p.bound)
				}
			})
		}
	}
	wg.Wait()
}

// trickle sends head at once, then slow one byte a second, reading
// whatever the server answers meanwhile; it returns when the server closes
// the connection (nil or a reset), or with the deadline's error.
func trickle(c net.Conn, head, slow string) error {
	if _, err := io.WriteString(c, head); err != nil {
		return err
	}
	readDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		readDone <- err
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case err := <-readDone:
			return err
		case <-tick.C:
			if i < len(slow) {
				if _, err := io.WriteString(c, slow[i:i+1]); err != nil {
					return <-readDone
				}
			}
		}
	}
}

// isClosed reports whether err is the peer closing or resetting.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
}

// rssKiB returns a process's resident set size, KiB (/proc/PID/status).
func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, errors.New("no VmRSS")
}

// TestHeaderFloodMemory: 200 connections that each send a 1000 KiB header
// that never ends (a connection the server closes is opened again) for
// 10 s leave the demo's resident memory within 64 MiB of what it was
// (issue 28: 61 → 483 MB with net/http's default 1 MiB header limit).
// Memory, not time: the process's RSS, sampled every 100 ms.
// SWITCHBOARD_FLOOD_CONNS sets another number of connections.
func TestHeaderFloodMemory(t *testing.T) {
	bin := testBinary(t)
	demo := startChild(t, bin, nil, "demo", "-mode", "echo", "-http", "127.0.0.1:0", "-relay", "127.0.0.1:0", "-log-format", "json")
	a, _ := demo.bound(t, "switchboard demo running", "web")
	addr := strings.TrimPrefix(a[0], "http://")
	waitHTTP(t, "http://"+addr+"/live")
	pid := demo.cmd.Process.Pid
	base, err := rssKiB(pid)
	if err != nil {
		t.Fatal(err)
	}
	const header, flood = 1000 << 10, 10 * time.Second
	conns := 200
	if v, err := strconv.Atoi(os.Getenv("SWITCHBOARD_FLOOD_CONNS")); err == nil && v > 0 {
		conns = v // to measure other floods (docs/security.md)
	}
	ctx, cancel := context.WithTimeout(t.Context(), flood)
	defer cancel()
	chunk := []byte(strings.Repeat("a", 64<<10))
	var wg sync.WaitGroup
	var mu sync.Mutex
	opened := 0
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				mu.Lock()
				opened++
				mu.Unlock()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Flood: ")
				for sent := 0; err == nil && sent < header; sent += len(chunk) {
					_, err = c.Write(chunk)
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, c) // the header never ends: wait for the server to give up
				}
				stop()
				c.Close()
				time.Sleep(100 * time.Millisecond) // then open another
			}
		})
	}
	peak := base
	for ctx.Err() == nil {
		if r, err := rssKiB(pid); err == nil {
			peak = max(peak, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	after, _ := rssKiB(pid)
	t.Logf("%d connections: demo RSS %d MiB before, %d MiB at most during the flood (%d connections opened), %d MiB after",
		conns, base>>10, peak>>10, opened, after>>10)
	if peak-base > 64<<10 {
		t.Fatalf("the header flood took the demo's RSS from %d to %d MiB", base>>10, peak>>10)
	}
	// And the demo still serves.
	waitHTTP(t, "http://"+addr+"/live")
}

// TestDescriptorFlood: the demo run with 256 descriptors, and 250
// keep-alive connections from one client that made a request each and
// stay idle, still takes a real call (a Pion client: signaling, ICE, DTLS,
// the echo back), and logs the server's cap instead of a line per failed
// accept (issue 28: the call failed with "502 … too many open files" and
// net/http logged every retry).
func TestDescriptorFlood(t *testing.T) {
	t.Parallel()
	bin := testBinary(t)
	if _, err := exec.LookPath("sh"); err != nil {
		t.Fatal(err)
	}
	demo := startChild(t, "sh", nil, "-c", `ulimit -n 256 && exec "$0" "$@"`, bin,
		"demo", "-mode", "echo", "-http", "127.0.0.1:0", "-relay", "127.0.0.1:0", "-log-format", "json")
	a, _ := demo.bound(t, "switchboard demo running", "web")
	url := a[0]
	addr := strings.TrimPrefix(url, "http://")
	waitHTTP(t, url+"/live")
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	for range 250 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			break // the accept queue is full
		}
		idle = append(idle, c)
		_, _ = io.WriteString(c, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	time.Sleep(time.Second)
	out, err := exec.Command(bin, "call", url+"/v1/calls", "-audio", "../../testdata/speech.wav", "-duration", "1s", "-ipv4", "-timeout", "20s").Output()
	var report struct {
		AudioEchoed bool   `json:"audio_echoed"`
		Error       string `json:"error"`
	}
	_ = json.Unmarshal(out, &report)
	if err != nil || !report.AudioEchoed {
		t.Errorf("the call after %d idle connections failed: %v\n%s", len(idle), err, out)
	}
	logs := demo.log.String()
	if n := strings.Count(logs, "Accept error"); n > 0 {
		t.Errorf("net/http logged %d failed accepts", n)
	}
	open := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := io.Copy(io.Discard, c)
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			open++
		}
	}
	t.Logf("%d idle connections made, %d still open after the call", len(idle), open)
	if t.Failed() {
		t.Log(logs)
	}
}
