// Package coturn runs a real coturn TURN server (the turnserver binary of
// the Debian package coturn) on loopback, for the benchmarks that compare
// Switchboard with a TURN relay: bench/relay (forwarding capacity) and
// bench/setup (call setup over TURN).
//
// The server listens on UDP only (no TLS, DTLS or TCP listeners), relays
// on 127.0.0.1 and allows loopback peers, which a production TURN server
// must not. It logs to a file in its own temporary directory; errors and
// Server.LogTail show the end of it.
package coturn

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pion/stun/v4"
)

// ErrNotInstalled is returned by Start when turnserver is not on PATH.
var ErrNotInstalled = errors.New("coturn: turnserver not found on PATH (Debian package coturn; scripts/deps.sh test installs it)")

// Config says how to start the server. The zero value is a server without
// authentication.
type Config struct {
	// User and Password, if User is set, turn on the long-term credential
	// mechanism (RFC 8489 §9.2) with this one static user in Realm.
	// Without a User, allocations need no credentials (--no-auth).
	User, Password string
	// Realm is the long-term credential realm; default "switchboard.test".
	Realm string
	// RelayThreads is coturn's --relay-threads; 0 leaves coturn's default
	// (one per CPU).
	RelayThreads int
	// Wrap, if set, rewrites the command before it starts: for example to
	// run it under taskset on one CPU. It must keep the arguments.
	Wrap func(*exec.Cmd) *exec.Cmd
	// StartTimeout bounds the wait for the first STUN Binding response;
	// default 10 s.
	StartTimeout time.Duration
}

// Server is a running turnserver. Stop it with Stop.
type Server struct {
	// Addr is the UDP address it listens on (127.0.0.1, a free port).
	Addr netip.AddrPort
	// Version is the first line of `turnserver --version`.
	Version string

	cmd    *exec.Cmd
	dir    string
	exited chan struct{}
}

// Start starts turnserver with cfg on a free loopback UDP port and returns
// once it has bound the port and answers a STUN Binding request (RFC 8489
// §3). The port is picked free and then bound by coturn, so a lost race
// (turnserver logs that it cannot bind) is retried on another port, up to
// three attempts in all.
func Start(cfg Config) (*Server, error) {
	bin, err := exec.LookPath("turnserver")
	if err != nil {
		return nil, ErrNotInstalled
	}
	if cfg.Realm == "" {
		cfg.Realm = "switchboard.test"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	var lastErr error
	for range 3 {
		port, err := freeUDPPort()
		if err != nil {
			return nil, err
		}
		s, err := start(bin, cfg, port)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// errBusy is start's error when the port it picked was taken before
// turnserver could bind it.
var errBusy = errors.New("address already in use")

// start runs turnserver once on port.
func start(bin string, cfg Config, port uint16) (*Server, error) {
	dir, err := os.MkdirTemp("", "coturn-")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port), dir: dir, exited: make(chan struct{})}
	args := []string{"-n", // no configuration file: everything is on the command line
		"--listening-ip", "127.0.0.1", "--listening-port", strconv.Itoa(int(port)), "--relay-ip", "127.0.0.1",
		"--min-port", "40000", "--max-port", "59999",
		"--allow-loopback-peers", "--no-multicast-peers", "--no-cli", "--no-tls", "--no-dtls", "--no-tcp",
		"--no-rfc5780", "--no-software-attribute", "--fingerprint",
		"--no-stdout-log", "--simple-log", "--log-file", s.logPath(),
		"--pidfile", filepath.Join(dir, "turnserver.pid"), "--userdb", filepath.Join(dir, "turndb")}
	if cfg.User != "" {
		args = append(args, "--lt-cred-mech", "--realm", cfg.Realm, "--user", cfg.User+":"+cfg.Password)
	} else {
		args = append(args, "--no-auth")
	}
	if cfg.RelayThreads > 0 {
		args = append(args, "--relay-threads", strconv.Itoa(cfg.RelayThreads))
	}
	cmd := exec.Command(bin, args...)
	setParentDeathSignal(cmd)
	if cfg.Wrap != nil {
		cmd = cfg.Wrap(cmd)
	}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("coturn: start turnserver: %w", err)
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); close(s.exited) }()
	for deadline := time.Now().Add(cfg.StartTimeout); time.Now().Before(deadline); {
		select {
		case <-s.exited:
			err := fmt.Errorf("coturn: turnserver exited at start: %s", s.LogTail(2000))
			_ = os.RemoveAll(dir)
			return nil, err
		default:
		}
		// turnserver does not exit when its port is taken: it logs
		// "Cannot bind" and tries again and again, while the port's owner
		// might answer the STUN ping. It logs "Total General servers"
		// once its listeners are bound.
		log, _ := os.ReadFile(s.logPath())
		if bytes.Contains(log, []byte("Cannot bind")) {
			s.Stop()
			return nil, fmt.Errorf("coturn: port %d was taken before turnserver bound it: %w", port, errBusy)
		}
		if bytes.Contains(log, []byte("Total General servers")) && stunPing(s.Addr, 100*time.Millisecond) {
			s.Version = version(bin)
			return s, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	err = fmt.Errorf("coturn: turnserver did not answer STUN on %s within %v: %s", s.Addr, cfg.StartTimeout, s.LogTail(2000))
	s.Stop()
	return nil, err
}

// PID is the process id of the server (of the Wrap command, which for
// taskset is the same process).
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM, kills the server if it has not exited 3 s later,
// waits for it and removes its directory. Call it once.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(3 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	_ = os.RemoveAll(s.dir)
}

// LogTail returns the last n bytes of the server's log.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > n {
		b = append([]byte("…"), b[len(b)-n:]...)
	}
	return string(bytes.TrimSpace(b))
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "turnserver.log") }

// stunPing sends a Binding request to addr and reports whether the
// matching response came within timeout.
func stunPing(addr netip.AddrPort, timeout time.Duration) bool {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return false
	}
	defer c.Close()
	req := stun.MustBuild(stun.TransactionID, stun.BindingRequest, stun.Fingerprint)
	if _, err := c.Write(req.Raw); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return false
	}
	res := stun.Message{Raw: buf[:n]}
	return res.Decode() == nil && res.TransactionID == req.TransactionID
}

// freeUDPPort returns a loopback UDP port that was free a moment ago.
func freeUDPPort() (uint16, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port), nil
}

func version(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
