package setupbench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pion/stun/v4"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// errNoTurnserver: the turnserver binary is not on PATH.
var errNoTurnserver = errors.New("setupbench: turnserver (coturn) not found on PATH")

// coturn is a turnserver process on loopback with one static
// long-term-credential user.
type coturn struct {
	cmd            *exec.Cmd
	dir            string
	addr           netip.AddrPort // listening UDP address
	user, password string
	version        string
	exited         chan struct{}
	out            *logbuf.Buffer
}

// startCoturn writes a temporary config and starts turnserver with it,
// returning once it answers a STUN Binding request.
func startCoturn(log *slog.Logger) (*coturn, error) {
	bin, err := exec.LookPath("turnserver")
	if err != nil {
		return nil, errNoTurnserver
	}
	dir, err := os.MkdirTemp("", "setupbench-coturn-")
	if err != nil {
		return nil, err
	}
	var pw [12]byte
	_, _ = rand.Read(pw[:])
	t := &coturn{dir: dir, user: "bench", password: hex.EncodeToString(pw[:]), exited: make(chan struct{}), out: &logbuf.Buffer{Max: 1 << 20}}
	var lastErr error
	for range 3 { // the port is picked free, then bound by coturn: retry a lost race
		port, err := freeUDPPort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		t.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		if lastErr = t.start(bin); lastErr == nil {
			t.version = strings.TrimSpace(versionOf(bin))
			log.Debug("coturn started", "addr", t.addr, "pid", t.cmd.Process.Pid)
			return t, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (t *coturn) start(bin string) error {
	conf := strings.Join([]string{
		fmt.Sprintf("listening-port=%d", t.addr.Port()),
		"listening-ip=127.0.0.1",
		"relay-ip=127.0.0.1",
		"min-port=40000",
		"max-port=49999",
		"lt-cred-mech",
		"realm=switchboard.bench",
		fmt.Sprintf("user=%s:%s", t.user, t.password),
		"fingerprint",
		"no-tls",
		"no-dtls",
		"no-tcp",
		"no-cli",
		"no-rfc5780",
		"no-software-attribute",
		"allow-loopback-peers",
		"no-multicast-peers",
		"userdb=" + filepath.Join(t.dir, "turndb"),
		"pidfile=" + filepath.Join(t.dir, "turnserver.pid"),
		"log-file=stdout",
		"simple-log",
		"",
	}, "\n")
	path := filepath.Join(t.dir, "turnserver.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return err
	}
	t.out.Reset()
	t.exited = make(chan struct{})
	cmd := exec.Command(bin, "-c", path)
	cmd.Stdout, cmd.Stderr = t.out, t.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("setupbench: start turnserver: %w", err)
	}
	t.cmd = cmd
	go func() { _ = cmd.Wait(); close(t.exited) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-t.exited:
			return fmt.Errorf("setupbench: turnserver exited: %s", t.out.Tail(2000))
		default:
		}
		if stunPing(t.addr, 100*time.Millisecond) {
			return nil
		}
	}
	t.kill()
	return fmt.Errorf("setupbench: turnserver did not answer STUN on %s within 5s: %s", t.addr, t.out.Tail(2000))
}

// kill stops the process this coturn started and waits for it.
func (t *coturn) kill() {
	if t.cmd == nil || t.cmd.Process == nil {
		return
	}
	_ = t.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-t.exited:
	case <-time.After(3 * time.Second):
		_ = t.cmd.Process.Kill()
		<-t.exited
	}
}

func (t *coturn) stop() {
	t.kill()
	_ = os.RemoveAll(t.dir)
}

// stunPing sends a Binding request to addr and reports whether a response came.
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
	var res stun.Message
	res.Raw = buf[:n]
	return res.Decode() == nil && res.TransactionID == req.TransactionID
}

func versionOf(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "?"
	}
	return string(out)
}
