// Package redistest runs a real redis-server on loopback for tests: the
// one launcher shared by the flow cache, relay, membership and command
// tests. (The chaos suite runs redis-server as one of its own processes,
// since it kills and restarts it.)
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is a redis-server started by Start.
type Server struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	done bool
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
	port := FreePort(tb)
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.cmd = exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", tb.TempDir()}, args...)...)
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", s.Addr); err == nil {
			_ = c.Close()
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatal("redis-server did not start")
	return nil
}

// Stop kills the server (a crash, not a shutdown). It is idempotent.
func (s *Server) Stop() {
	if s.done {
		return
	}
	s.done = true
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
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
