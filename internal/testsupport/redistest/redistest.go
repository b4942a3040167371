// Package redistest runs a real redis-server on loopback for tests: the
// one launcher shared by the flow cache, relay, membership and command
// tests. (The chaos suite runs redis-server as one of its own processes,
// since it kills and restarts it.)
package redistest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Server is a redis-server started by Start.
type Server struct {
	Addr   string // 127.0.0.1:port
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited (and been waited for)
	done   bool
}

// Start runs redis-server on a free loopback port without persistence and
// stops it at the end of the test. Without redis-server the test is
// skipped, except in CI (CI set), where that fails.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartArgs(tb)
}

// StartArgs is Start with more redis-server arguments, such as
// "--requirepass", "secret".
func StartArgs(tb testing.TB, args ...string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatal("redis-server is not installed; in CI it must be (scripts/deps.sh)")
		}
		tb.Skip("redis-server not installed (apt-get install redis-server)")
	}
	// The port was free when FreePort picked it; another process may bind
	// it before redis-server does. Then redis-server exits ("Address
	// already in use"), while a dial to the port would reach the other
	// process: readiness is redis-server's own log line, and a lost port
	// is tried again with another.
	const attempts = 5
	for attempt := 1; ; attempt++ {
		s, busy, err := start(tb, bin, args)
		if err == nil {
			return s
		}
		if !busy || attempt == attempts {
			tb.Fatal(err)
		}
	}
}

// readyLine is what redis-server logs once it accepts connections.
var readyLine = []byte("Ready to accept connections")

// start runs redis-server once on a port FreePort picked, and waits up to
// 10 s for its readiness line. busy reports that the port was taken
// before redis-server could bind it.
func start(tb testing.TB, bin string, args []string) (s *Server, busy bool, err error) {
	tb.Helper()
	port := FreePort(tb)
	dir := tb.TempDir()
	logPath := filepath.Join(dir, "redis.log")
	s = &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), exited: make(chan struct{})}
	s.cmd = exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logPath}, args...)...)
	if err := s.cmd.Start(); err != nil {
		return nil, false, err
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(10 * time.Second)
	for {
		log, _ := os.ReadFile(logPath)
		if bytes.Contains(log, readyLine) {
			tb.Cleanup(s.Stop)
			return s, false, nil
		}
		select {
		case <-s.exited:
			log, _ = os.ReadFile(logPath)
			return nil, bytes.Contains(log, []byte("Address already in use")),
				fmt.Errorf("redis-server on %s exited before it was ready: %s", s.Addr, bytes.TrimSpace(log))
		case <-timeout:
			s.Stop()
			return nil, false, fmt.Errorf("redis-server on %s not ready in 10 s: %s", s.Addr, bytes.TrimSpace(log))
		case <-tick.C:
		}
	}
}

// Stop kills the server (a crash, not a shutdown). It is idempotent.
func (s *Server) Stop() {
	if s.done {
		return
	}
	s.done = true
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// FreePort returns a loopback TCP port that was free a moment ago: an
// address where nothing listens.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}
