package transceiver

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pion/dtls/v3"
	"github.com/pion/dtls/v3/pkg/crypto/selfsign"
	"github.com/pion/stun/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestSetupLogLimit: setup-failure lines come setupLogBurst at once, then
// setupLogRate a second, and the first line after a gap says how many
// were dropped.
func TestSetupLogLimit(t *testing.T) {
	var l setupLog
	now := time.Unix(1000, 0)
	for i := range setupLogBurst {
		if ok, _ := l.allow(now); !ok {
			t.Fatalf("line %d of the burst refused", i)
		}
	}
	for range 3 {
		if ok, _ := l.allow(now); ok {
			t.Fatal("a line past the burst allowed")
		}
	}
	ok, suppressed := l.allow(now.Add(time.Second / setupLogRate))
	if !ok || suppressed != 3 {
		t.Fatalf("after a token's time: allowed %v, %d suppressed reported; want true, 3", ok, suppressed)
	}
	if ok, _ := l.allow(now.Add(time.Second / setupLogRate)); ok {
		t.Fatal("a second line allowed on one token")
	}
}

// rawClient is a client that answers for itself: it posts an offer, reads
// the answer's ICE credentials and candidate, and sends checks from a UDP
// socket of its own.
type rawClient struct {
	sock      *net.UDPConn
	to        netip.AddrPort
	user, pwd string
}

// offerRaw posts offer to url and returns a rawClient for its answer.
func offerRaw(t *testing.T, url, offer string) *rawClient {
	t.Helper()
	resp := post(t, url+"/v1/calls", "application/sdp", offer)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 {
		t.Fatalf("offer: %d %s", resp.StatusCode, body)
	}
	ans := string(body)
	field := func(re string) string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(ans)
		if m == nil {
			t.Fatalf("no %s in the answer:\n%s", re, ans)
		}
		return m[1]
	}
	remote := regexp.MustCompile(`a=ice-ufrag:(\S+)`).FindStringSubmatch(offer)
	c := &rawClient{user: field(`a=ice-ufrag:(\S+)`) + ":" + remote[1], pwd: field(`a=ice-pwd:(\S+)`)}
	cand := regexp.MustCompile(`a=candidate:\S+ 1 udp \d+ (\S+) (\d+) typ host`).FindStringSubmatch(ans)
	if cand == nil {
		t.Fatalf("no host candidate in the answer:\n%s", ans)
	}
	c.to = netip.MustParseAddrPort(net.JoinHostPort(cand[1], cand[2]))
	var err error
	if c.sock, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.sock.Close() })
	return c
}

// check sends one authenticated check (no nomination).
func (c *rawClient) check(t *testing.T) {
	t.Helper()
	m, err := stun.Build(stun.TransactionID, stun.BindingRequest, stun.NewUsername(c.user),
		stun.NewShortTermIntegrity(c.pwd), stun.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.sock.WriteToUDPAddrPort(m.Raw, c.to); err != nil {
		t.Fatal(err)
	}
}

// dtlsOnly is a client socket that a DTLS peer reads: only DTLS (RFC 7983).
type dtlsOnly struct{ *net.UDPConn }

func (c dtlsOnly) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, a, err := c.ReadFromUDP(b)
		if err != nil || (n > 0 && b[0] >= 20 && b[0] <= 63) {
			return n, a, err
		}
	}
}

// TestSetupFailurePhases: a session whose setup fails is counted under
// where it stopped and logged with it: checks but no DTLS from the client
// (dtls no_dtls), DTLS from the client but no complete handshake (dtls
// timeout), and connected without the offer's SCTP association (sctp
// timeout), which does not end the session. Before, the first two were
// one connect timeout, and the third was not seen.
func TestSetupFailurePhases(t *testing.T) {
	var out logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, url := directServerLog(t, log, func(c *Config) { c.SetupTimeout, c.CheckTimeout = 2*time.Second, time.Second })
	failures := func(phase, reason string) float64 {
		return testutil.ToFloat64(s.metrics.setupFailures.WithLabelValues(phase, reason))
	}

	// Checks, and never any DTLS back.
	quiet := offerRaw(t, url, clientOffer(t, true))
	quiet.check(t)
	// Checks and DTLS that goes nowhere: a record DTLS discards.
	stuck := offerRaw(t, url, clientOffer(t, true))
	stuck.check(t)
	time.Sleep(50 * time.Millisecond)
	if _, err := stuck.sock.WriteToUDPAddrPort([]byte{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0}, stuck.to); err != nil {
		t.Fatal(err)
	}
	// A DTLS server of the test's own completes the handshake (the offer
	// names its certificate), and no SCTP follows.
	cert, err := selfsign.GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	var hexes []string
	for _, b := range sum {
		hexes = append(hexes, fmt.Sprintf("%02X", b))
	}
	offer := regexp.MustCompile(`a=fingerprint:\S+ \S+`).ReplaceAllString(clientOffer(t, true), "a=fingerprint:sha-256 "+strings.Join(hexes, ":"))
	mute := offerRaw(t, url, offer)
	mute.check(t)
	conn, err := dtls.ServerWithOptions(dtlsOnly{mute.sock}, net.UDPAddrFromAddrPort(mute.to),
		dtls.WithCertificates(cert), dtls.WithSRTPProtectionProfiles(dtls.SRTP_AEAD_AES_128_GCM),
		dtls.WithExtendedMasterSecret(dtls.RequireExtendedMasterSecret), dtls.WithClientAuth(dtls.RequireAnyClientCert),
		dtls.WithInsecureSkipVerifyHello(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatalf("the test's DTLS handshake: %v", err)
	}

	deadline := time.Now().Add(15 * time.Second)
	for (failures(phaseDTLS, failNoDTLS) < 1 || failures(phaseDTLS, failTimeout) < 1 || failures(failPhaseSCTP, failTimeout) < 1) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, f := range []struct {
		phase, reason, stopped string
	}{{phaseDTLS, failNoDTLS, "no_dtls"}, {phaseDTLS, failTimeout, "dtls"}, {failPhaseSCTP, failTimeout, "connected"}} {
		if n := failures(f.phase, f.reason); n != 1 {
			t.Errorf("setup failures %s/%s: %v, want 1", f.phase, f.reason, n)
		}
		want := fmt.Sprintf(`phase=%s reason=%s stopped_at=%s`, f.phase, f.reason, f.stopped)
		found := false
		for _, l := range strings.Split(out.String(), "\n") {
			found = found || strings.Contains(l, `msg="session setup failed"`) && strings.Contains(l, want)
		}
		if !found {
			t.Errorf("no setup failure line with %q in:\n%s", want, out.String())
		}
	}
	if n := failures(phaseICE, failNoCheck); n != 0 {
		t.Errorf("%v sessions counted without a check; each checked", n)
	}
	// The connected one goes on: two sessions ended, one is live.
	if n := s.Sessions(); n != 1 {
		t.Errorf("%d sessions live, want 1 (the connected one without SCTP)", n)
	}
}
