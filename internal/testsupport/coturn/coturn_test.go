package coturn

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/pion/stun/v4"
	"github.com/pion/turn/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startT is Start, skipped without turnserver except in CI.
func startT(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(cfg)
	if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// allocate asks s for a relayed address (RFC 8656 §7) with the given
// credentials and returns the error, if any.
func allocate(t *testing.T, s *Server, user, password, realm string) error {
	t.Helper()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := turn.NewClient(&turn.ClientConfig{
		STUNServerAddr: s.Addr.String(), TURNServerAddr: s.Addr.String(),
		Username: user, Password: password, Realm: realm,
		Conn: conn, RTO: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Listen(); err != nil {
		t.Fatal(err)
	}
	relayed, err := c.Allocate()
	if err != nil {
		return err
	}
	return relayed.Close()
}

// TestCredentials: with a user configured, an allocation succeeds with its
// password and is refused with another one.
func TestCredentials(t *testing.T) {
	s := startT(t, Config{User: "alice", Password: "secret"})
	if s.Version == "" || s.PID() <= 0 {
		t.Fatalf("version %q, pid %d", s.Version, s.PID())
	}
	if err := allocate(t, s, "alice", "secret", "switchboard.test"); err != nil {
		t.Fatalf("allocate with the right password: %v\nlog: %s", err, s.LogTail(2000))
	}
	if err := allocate(t, s, "alice", "wrong", "switchboard.test"); err == nil {
		t.Fatal("allocate with a wrong password succeeded")
	}
}

// TestNoAuth: without a user, an Allocate request without credentials
// succeeds and names a relayed address (RFC 8656 §7.1, §7.3); the pion
// client always expects the 401 challenge, so this one is built by hand.
func TestNoAuth(t *testing.T) {
	s := startT(t, Config{RelayThreads: 1})
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// REQUESTED-TRANSPORT: protocol 17, UDP (RFC 8656 §18.7).
	req := stun.MustBuild(stun.TransactionID, stun.NewType(stun.MethodAllocate, stun.ClassRequest),
		stun.RawAttribute{Type: stun.AttrRequestedTransport, Value: []byte{17, 0, 0, 0}}, stun.Fingerprint)
	if _, err := c.Write(req.Raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no answer to Allocate: %v\nlog: %s", err, s.LogTail(2000))
	}
	res := stun.Message{Raw: buf[:n]}
	if err := res.Decode(); err != nil {
		t.Fatal(err)
	}
	if res.Type != stun.NewType(stun.MethodAllocate, stun.ClassSuccessResponse) {
		var code stun.ErrorCodeAttribute
		_ = code.GetFrom(&res)
		t.Fatalf("answer %v %v, want an Allocate success", res.Type, code)
	}
	var relayed stun.XORMappedAddress
	if err := relayed.GetFromAs(&res, stun.AttrXORRelayedAddress); err != nil || !relayed.IP.IsLoopback() {
		t.Fatalf("relayed address %v (%v), want one on loopback", relayed, err)
	}
}

// TestBusyPort: on a port another socket holds (one that answers STUN, as
// a transceiver would), turnserver does not come up, and start reports
// the lost race for Start to try another port instead of taking the
// other socket's answers for coturn's.
func TestBusyPort(t *testing.T) {
	bin, err := exec.LookPath("turnserver")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	busy, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	go func() { // answer Binding requests as a STUN server would
		buf := make([]byte, 1500)
		for {
			n, from, err := busy.ReadFromUDP(buf)
			if err != nil {
				return
			}
			req := stun.Message{Raw: append([]byte(nil), buf[:n]...)}
			if req.Decode() != nil {
				continue
			}
			res := stun.MustBuild(stun.NewTransactionIDSetter(req.TransactionID), stun.BindingSuccess, stun.Fingerprint)
			_, _ = busy.WriteToUDP(res.Raw, from)
		}
	}()
	port := uint16(busy.LocalAddr().(*net.UDPAddr).Port)
	s, err := start(bin, Config{Realm: "switchboard.test", StartTimeout: 10 * time.Second}, port)
	if err == nil {
		s.Stop()
		t.Fatalf("turnserver on busy port %d: started", port)
	}
	if !errors.Is(err, errBusy) {
		t.Fatalf("turnserver on busy port %d: %v, want errBusy", port, err)
	}
}
