package peer

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/datachannel"
	"github.com/pion/dtls/v3/pkg/crypto/selfsign"
	"github.com/pion/rtp"
	"github.com/pion/stun/v4"
	"github.com/pion/webrtc/v4"
)

// TestMain (goleak) is in sdp_test.go.

// udpConn gives a UDP socket the method names of PacketConn, and records
// the DTLS handshake's datagrams in trace (traceDTLS).
type udpConn struct {
	*net.UDPConn
	trace *trace
}

func (c udpConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	n, a, err := c.ReadFromUDPAddrPort(b)
	if err == nil {
		traceDTLS(c.trace, "from", a, b[:n])
	}
	return n, a, err
}

func (c udpConn) WriteToAddrPort(b []byte, a netip.AddrPort) (int, error) {
	traceDTLS(c.trace, "to", a, b)
	return c.WriteToUDPAddrPort(b, a)
}

// server is an Endpoint on a loopback socket.
type server struct {
	ep   *Endpoint
	sock *net.UDPConn
	// advertise, if valid, is the answer's candidate instead of sock's
	// address (a test's cuttable path).
	advertise netip.AddrPort
	cert      tls.Certificate
	fp        Fingerprint
	// trace records the DTLS handshakes' datagrams at the socket.
	trace *trace
}

func newServer(t testing.TB, mutate ...func(*Config)) *server {
	t.Helper()
	sock, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := selfsign.GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	tr := newTrace()
	cfg := Config{Conn: udpConn{sock, tr}, InsecureSkipHelloVerify: true}
	for _, m := range mutate {
		m(&cfg)
	}
	ep, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ep: ep, sock: sock, cert: cert, fp: Fingerprint{Hash: "sha-256", Digest: sum[:]}, trace: tr}
	t.Cleanup(func() {
		_ = sock.Close()
		ep.Close()
	})
	return s
}

func (s *server) addr() netip.AddrPort { return s.sock.LocalAddr().(*net.UDPAddr).AddrPort() }

func (s *server) candidate() netip.AddrPort {
	if s.advertise.IsValid() {
		return s.advertise
	}
	return s.addr()
}

// path is a UDP forwarder between one client and the server that can be
// cut: the client's traffic then stops reaching the server, as when a
// laptop's lid closes. Its back socket is the client's address as the
// server sees it; rebind replaces it, as a NAT that gives the client a new
// port. What the server sends goes to the candidate address the client
// last sent from.
//
// The path forwards only the client's datagrams (from one of its
// candidates' addresses) and the server's: on a shared machine a port
// the path's socket was given may still receive another process's flow
// (its peer went on sending after it closed), and a stranger's datagrams
// that made it "the client" would send the server's DTLS and check
// answers there, stalling the handshake: no session state for 10 s, the
// symptom of TestConsent's one CI failure (TestPathStrangers).
type path struct {
	front  *net.UDPConn
	back   atomic.Pointer[net.UDPConn]
	server netip.AddrPort
	owner  *client
	client atomic.Pointer[netip.AddrPort]
	cut    atomic.Bool
	wg     sync.WaitGroup
	// strangers counts the datagrams dropped that came from neither
	// the client nor the server.
	strangers atomic.Int64
	// lastRTP is a copy of the last SRTP datagram (not SRTCP) the
	// client sent through the path; firstNom of the first nominating
	// check (a Binding request with USE-CANDIDATE).
	lastRTP, firstNom atomic.Pointer[[]byte]
	// trace records each change of client and the DTLS handshake's
	// datagrams sent to it.
	trace *trace
}

// newPath returns a path between c and the server.
func newPath(t *testing.T, server netip.AddrPort, c *client) *path {
	t.Helper()
	p := &path{server: server, owner: c, trace: newTrace()}
	var err error
	if p.front, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	p.rebind(t)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 1500)
		var m stun.Message
		for {
			n, from, err := p.front.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if !p.owner.isCandidate(from) {
				p.stranger(from)
				continue
			}
			if old := p.client.Swap(&from); old == nil || *old != from {
				p.trace.add("path: the client sends from %v", from)
			}
			b := buf[:n]
			switch {
			case n > 12 && b[0] >= 128 && b[0] <= 191 && !isRTCP(b):
				c := bytes.Clone(b)
				p.lastRTP.Store(&c)
			case n > 0 && b[0] <= 3 && p.firstNom.Load() == nil:
				m.Raw = append(m.Raw[:0], b...)
				if m.Decode() == nil && m.Type == stun.BindingRequest && m.Contains(stun.AttrUseCandidate) {
					c := bytes.Clone(b)
					p.firstNom.Store(&c)
				}
			}
			if !p.cut.Load() {
				_, _ = p.back.Load().WriteToUDPAddrPort(b, server)
			}
		}
	}()
	t.Cleanup(func() {
		_ = p.front.Close()
		_ = p.back.Load().Close()
		p.wg.Wait()
	})
	return p
}

// rebind gives the path a new back socket, so the client's later
// datagrams reach the server from a new port, and closes the old one:
// what the server sends there is lost, as at a NAT whose mapping is gone.
func (p *path) rebind(t *testing.T) {
	t.Helper()
	back, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := back.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if from != p.server {
				p.stranger(from)
				continue
			}
			if c := p.client.Load(); c != nil {
				traceDTLS(p.trace, "path to client", *c, buf[:n])
				_, _ = p.front.WriteToUDPAddrPort(buf[:n], *c)
			}
		}
	}()
	if old := p.back.Swap(back); old != nil {
		_ = old.Close()
	}
}

// stranger drops a datagram from neither the client nor the server,
// tracing the first.
func (p *path) stranger(from netip.AddrPort) {
	if p.strangers.Add(1) == 1 {
		p.trace.add("path: a stranger's datagram from %v dropped (and any later ones)", from)
	}
}

// andDrops returns more followed by the datagrams the path dropped and
// the kernel's drops at its sockets (a report's, sessionParts.more).
func (p *path) andDrops(more func() string) func() string {
	return func() string {
		return more() + fmt.Sprintf("path: %d datagrams from strangers dropped\n", p.strangers.Load()) +
			kernelDrops(p.addr().Port(), p.backAddr().Port())
	}
}

func (p *path) addr() netip.AddrPort { return p.front.LocalAddr().(*net.UDPAddr).AddrPort() }

// backAddr is the client's address as the server sees it.
func (p *path) backAddr() netip.AddrPort { return sockAddr(p.back.Load()) }

// client is a Pion PeerConnection offering Opus audio and an oai-events
// data channel, as the transceiver's clients do.
type client struct {
	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticRTP
	dc    *webrtc.DataChannel
	echo  chan *rtp.Packet // RTP the client receives
	msgs  chan string      // data channel messages it receives
	open  chan struct{}
	dtls  chan webrtc.DTLSTransportState
	ice   chan webrtc.ICEConnectionState
	// trace records the client's candidates and its ICE, DTLS and
	// connection states, and each selected pair.
	trace *trace
	// cands are the addresses of the client's local candidates,
	// gathered before its offer is complete.
	candMu sync.Mutex
	cands  []netip.AddrPort
}

// isCandidate reports whether a is the address of one of c's local
// candidates.
func (c *client) isCandidate(a netip.AddrPort) bool {
	c.candMu.Lock()
	defer c.candMu.Unlock()
	return slices.Contains(c.cands, a)
}

func newClient(t *testing.T, data bool, mutate ...func(*webrtc.SettingEngine)) *client {
	t.Helper()
	var me webrtc.MediaEngine
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	tr := newTrace()
	var se webrtc.SettingEngine
	se.LoggerFactory = traceLogs{tr}
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	for _, m := range mutate {
		m(&se)
	}
	pc, err := webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithSettingEngine(se)).NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	c := &client{pc: pc, echo: make(chan *rtp.Packet, 64), msgs: make(chan string, 16), open: make(chan struct{}),
		dtls: make(chan webrtc.DTLSTransportState, 16), ice: make(chan webrtc.ICEConnectionState, 16), trace: tr}
	t.Cleanup(func() { _ = pc.Close() })
	c.track, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "client")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.AddTrack(c.track); err != nil {
		t.Fatal(err)
	}
	if data {
		c.dc, err = pc.CreateDataChannel("oai-events", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.dc.OnOpen(func() { close(c.open) })
		c.dc.OnMessage(func(m webrtc.DataChannelMessage) { c.msgs <- string(m.Data) })
	}
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		for {
			p, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			select {
			case c.echo <- p:
			default:
			}
		}
	})
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		c.trace.add("client: dtls %v", st)
		c.dtls <- st
	})
	pc.SCTP().Transport().ICETransport().OnSelectedCandidatePairChange(func(p *webrtc.ICECandidatePair) {
		c.trace.add("client: selected pair %v", p)
	})
	pc.OnICECandidate(func(cand *webrtc.ICECandidate) {
		if cand == nil {
			return
		}
		c.trace.add("client: candidate %v", cand)
		if ip, err := netip.ParseAddr(cand.Address); err == nil {
			c.candMu.Lock()
			c.cands = append(c.cands, netip.AddrPortFrom(ip.Unmap(), cand.Port))
			c.candMu.Unlock()
		}
	})
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) { c.trace.add("client: connection %v", st) })
	pc.OnICEConnectionStateChange(func(st webrtc.ICEConnectionState) {
		c.trace.add("client: ice %v", st)
		select {
		case c.ice <- st:
		default:
		}
	})
	return c
}

// offer returns the client's complete offer.
func (c *client) offer(t *testing.T, restart bool) string {
	t.Helper()
	o, err := c.pc.CreateOffer(&webrtc.OfferOptions{ICERestart: restart})
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(c.pc)
	if err := c.pc.SetLocalDescription(o); err != nil {
		t.Fatal(err)
	}
	<-gathered
	return c.pc.LocalDescription().SDP
}

func (c *client) answer(t *testing.T, sdp string) {
	t.Helper()
	if err := c.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: sdp}); err != nil {
		t.Fatalf("client refused the answer: %v\n%s", err, sdp)
	}
}

// sessionParts is what a test's session reports.
type sessionParts struct {
	states chan State
	checks atomic.Int64
	// checked is signalled at each valid check (capacity 1: a signal
	// pending stands for any number of checks).
	checked chan struct{}
	dcs     chan *datachannel.DataChannel
	// trace records the session's states and checks; traces are those a
	// wait that times out prints with it, since start, and more what it
	// adds (the client's and session's states at that moment).
	trace  *trace
	traces []*trace
	start  time.Time
	more   func() string
}

// report is what a wait that timed out prints: the traces merged in time
// order and the state at the moment.
func (p *sessionParts) report() string {
	s := "trace:\n" + mergeTraces(p.start, append([]*trace{p.trace}, p.traces...)...)
	if p.more != nil {
		s += p.more()
	}
	return s
}

var ufragSeq atomic.Int64

func newCreds() (ufrag, pwd string) {
	n := strconv.FormatInt(ufragSeq.Add(1), 10)
	return "ufrag" + n, "pwdpwdpwdpwdpwdpwdpwdpwd" + n
}

// connect offers from c, answers with a session on s, and returns it.
func connect(t *testing.T, s *server, c *client, mutate ...func(*SessionConfig)) (*Session, *sessionParts) {
	t.Helper()
	o, err := ParseOffer(c.offer(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ufrag, pwd := newCreds()
	parts := &sessionParts{states: make(chan State, 32), checked: make(chan struct{}, 1), dcs: make(chan *datachannel.DataChannel, 4),
		trace: newTrace(), traces: []*trace{s.trace, c.trace}, start: time.Now()}
	role, setup := DTLSClient, "active"
	if o.Setup == "active" {
		role, setup = DTLSServer, "passive"
	}
	cfg := SessionConfig{
		LocalUfrag: ufrag, LocalPwd: pwd, RemoteUfrag: o.ICEUfrag, Role: role, Certificate: s.cert,
		Fingerprints: o.Fingerprints, Data: o.Data >= 0, RemoteSCTPInit: o.SCTPInit,
		OnCheck: func(from netip.AddrPort, nominated bool) {
			parts.trace.add("session: check from %v nominated %v", from, nominated)
			parts.checks.Add(1)
			select {
			case parts.checked <- struct{}{}:
			default:
			}
		},
		OnState: func(st State) {
			parts.trace.add("session: state %v", st)
			parts.states <- st
		},
		OnDataChannel: func(dc *datachannel.DataChannel) { parts.dcs <- dc },
	}
	sess := newSession(t, s, cfg, mutate...)
	parts.more = func() string {
		return sessionNow(sess) + clientNow(c) + kernelDrops(append(clientPorts(c), s.addr().Port())...)
	}
	ans, err := Answer(o, AnswerParams{
		ICEUfrag: ufrag, ICEPwd: pwd, Fingerprint: s.fp, Setup: setup, Candidate: s.candidate(),
		AudioSSRC: 0x1234, CNAME: "peer-test", StreamID: "switchboard", TrackID: "audio",
		SCTPPort: 5000, MaxMessageSize: 65536, SCTPInit: sess.LocalSCTPInit(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c.answer(t, ans)
	return sess, parts
}

func waitState(t *testing.T, p *sessionParts, want State) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case st := <-p.states:
			if st == want {
				return
			}
			if st == StateDTLSFailed || st == StateFailed && want != StateFailed {
				t.Fatalf("session state %v while waiting for %v", st, want)
			}
		case <-timeout:
			t.Fatalf("no session state %v\n%s", want, p.report())
		}
	}
}

// echoRTP reads the session's RTP and writes it back with the session's
// SSRC, until the session closes.
func echoRTP(sess *Session, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, 1500)
	var p rtp.Packet
	for {
		n, err := sess.ReadRTP(buf)
		if err != nil {
			return
		}
		if p.Unmarshal(buf[:n]) != nil {
			continue
		}
		p.SSRC = 0x1234
		_ = sess.WriteRTP(&p.Header, p.Payload)
	}
}

// echoDC answers every message on dc with "echo:" and the message.
func echoDC(dc *datachannel.DataChannel, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, isString, err := dc.ReadDataChannel(buf)
		if err != nil {
			return
		}
		_, _ = dc.WriteDataChannel(append([]byte("echo:"), buf[:n]...), isString)
	}
}

// startDCEcho waits for the session's data channel, echoes it (see
// echoDC) on a goroutine counted in wg until the session closes, and
// waits for the client's channel to open. It returns the session's
// channel.
func startDCEcho(t *testing.T, parts *sessionParts, c *client, wg *sync.WaitGroup) *datachannel.DataChannel {
	t.Helper()
	var dc *datachannel.DataChannel
	select {
	case dc = <-parts.dcs:
	case <-time.After(10 * time.Second):
		t.Fatal("no data channel")
	}
	wg.Add(1)
	go echoDC(dc, wg)
	<-c.open
	return dc
}

// sendUntilEcho sends Opus-sized packets from the client until one comes
// back with the payload it carried.
func sendUntilEcho(t *testing.T, c *client, mark byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for seq := uint16(0); time.Now().Before(deadline); seq++ {
		payload := []byte{mark, 0xfc, 0xff, 0xfe, byte(seq)}
		if err := c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: uint32(seq) * 960}, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-c.echo:
			if p.SSRC != 0x1234 {
				t.Fatalf("echo SSRC %#x, want 0x1234", p.SSRC)
			}
			if len(p.Payload) > 0 && p.Payload[0] == mark {
				return
			}
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no RTP echoed")
}

func dcRoundTrip(t *testing.T, c *client, msg string) {
	t.Helper()
	if err := c.dc.SendText(msg); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-c.msgs:
		if got != "echo:"+msg {
			t.Fatalf("data channel got %q, want %q", got, "echo:"+msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no data channel echo")
	}
}

// TestPionClient: a Pion client connects to a session: ICE-lite checks,
// DTLS, SRTP both ways (RTP echoed), data channel messages both ways, an
// ICE restart after which both still flow and the old ufrag is refused,
// and the server's close, which the client sees as DTLS closed.
func TestPionClient(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true)
	sess, parts := connect(t, s, c)
	waitState(t, parts, StateConnected)
	if parts.checks.Load() == 0 {
		t.Fatal("OnCheck saw no check")
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	if dc := startDCEcho(t, parts, c, &wg); dc.Config.Label != "oai-events" {
		t.Fatalf("label %q", dc.Config.Label)
	}
	sendUntilEcho(t, c, 1)
	dcRoundTrip(t, c, `{"type":"hello"}`)

	// ICE restart: the client's new offer, new local credentials.
	oldUfrag := sess.ufrag()
	o, err := ParseOffer(c.offer(t, true))
	if err != nil {
		t.Fatal(err)
	}
	ufrag, pwd := newCreds()
	if err := sess.Restart(ufrag, pwd, o.ICEUfrag); err != nil {
		t.Fatal(err)
	}
	ans, err := Answer(o, AnswerParams{
		ICEUfrag: ufrag, ICEPwd: pwd, Fingerprint: s.fp, Setup: "active", Candidate: s.addr(),
		AudioSSRC: 0x1234, CNAME: "peer-test", StreamID: "switchboard", TrackID: "audio", SCTPPort: 5000, MaxMessageSize: 65536,
	})
	if err != nil {
		t.Fatal(err)
	}
	select { // a check of the old generation, from before the restart
	case <-parts.checked:
	default:
	}
	c.answer(t, ans)
	select {
	case <-parts.checked:
	case <-time.After(10 * time.Second):
		t.Fatal("no check with the restarted credentials")
	}
	sendUntilEcho(t, c, 2)
	dcRoundTrip(t, c, "after restart")

	// A check of the old generation (old ufrags, old pwd) is not
	// answered, nor one with the new ufrags signed with the old pwd.
	unknown := s.ep.Drops()[DropSTUNUnknownUfrag]
	sendRaw(t, s.addr(), bindingRequest(t, oldUfrag+":"+sess.cfg.RemoteUfrag, sess.cfg.LocalPwd, true), false)
	waitDrop(t, s.ep, DropSTUNUnknownUfrag, unknown+1)
	integrity := s.ep.Drops()[DropSTUNBadIntegrity]
	sendRaw(t, s.addr(), bindingRequest(t, ufrag+":"+o.ICEUfrag, sess.cfg.LocalPwd, true), false)
	waitDrop(t, s.ep, DropSTUNBadIntegrity, integrity+1)

	// The server closes: the client sees DTLS closed (close_notify).
	_ = sess.Close()
	wg.Wait()
	waitClientDTLS(t, c, webrtc.DTLSTransportStateClosed)
}

func waitClientDTLS(t *testing.T, c *client, want webrtc.DTLSTransportState) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case st := <-c.dtls:
			if st == want {
				return
			}
		case <-timeout:
			t.Fatalf("client DTLS never %v", want)
		}
	}
}

// TestClientCloses: the client's close (DTLS close_notify) is
// StateClosed.
func TestClientCloses(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true)
	_, parts := connect(t, s, c)
	waitState(t, parts, StateConnected)
	<-c.open
	if err := c.pc.Close(); err != nil {
		t.Fatal(err)
	}
	waitState(t, parts, StateClosed)
}

// connectCuttable connects a client (with a data channel if data) to a
// server whose consent tick is 20 ms, through a path the test can cut
// (p.cut), with the session's disconnected and failed timeouts, and
// waits until the session is connected.
func connectCuttable(t *testing.T, data bool, disconnected, failed time.Duration) (*server, *path, *client, *sessionParts) {
	t.Helper()
	s := newServer(t, func(c *Config) { c.ConsentTick = 20 * time.Millisecond })
	c := newClient(t, data)
	p := newPath(t, s.addr(), c)
	_, parts := connectPath(t, s, c, p, func(sc *SessionConfig) {
		sc.DisconnectedTimeout, sc.FailedTimeout = disconnected, failed
	})
	return s, p, c, parts
}

// connectPath connects client c to server s through path p (s advertises
// p's address), with p's trace and drops in the report of a timed-out
// wait, and waits for StateConnected.
func connectPath(t *testing.T, s *server, c *client, p *path, mutate ...func(*SessionConfig)) (*Session, *sessionParts) {
	t.Helper()
	s.advertise = p.addr()
	sess, parts := connect(t, s, c, mutate...)
	parts.traces = append(parts.traces, p.trace)
	parts.more = p.andDrops(parts.more)
	waitState(t, parts, StateConnected)
	return sess, parts
}

// TestPathStrangers: a stranger's flow to the path's front port (on a
// shared machine, another process's peer still sending to a port the
// path's socket was given) does not take the client's place: the client
// connects through the path. Before the path dropped strangers, the
// server's answers and every ClientHello went to the stranger, and the
// session stalled with no state for 10 s, as TestConsent once did in CI.
// The stranger sends every millisecond, oftener than the server answers
// on a loaded machine.
func TestPathStrangers(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	s.advertise = p.addr()
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		rtp := make([]byte, 172) // a 20 ms Opus packet's size
		rtp[0] = 0x80
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, _ = stranger.WriteToUDPAddrPort(rtp, p.addr())
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		_ = stranger.Close()
	})
	connectPath(t, s, c, p)
	if p.strangers.Load() == 0 {
		t.Fatal("no stranger's datagram reached the path")
	}
}

// TestConsent: a connected client that goes silent is disconnected, back
// when its traffic resumes, and failed when it stays silent.
func TestConsent(t *testing.T) {
	_, p, c, parts := connectCuttable(t, false, 300*time.Millisecond, 3*time.Second)
	p.cut.Store(true)
	waitState(t, parts, StateDisconnected)
	p.cut.Store(false)
	if err := c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 1}, Payload: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, parts, StateICEConnected)
	p.cut.Store(true)
	waitState(t, parts, StateDisconnected)
	waitState(t, parts, StateFailed)
}

// TestWrongFingerprint: a client whose certificate matches no fingerprint
// of the offer fails DTLS.
func TestWrongFingerprint(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true)
	_, parts := connect(t, s, c, func(sc *SessionConfig) {
		fp := sc.Fingerprints[0]
		fp.Digest = append([]byte(nil), fp.Digest...)
		fp.Digest[0] ^= 0xff
		sc.Fingerprints = []Fingerprint{fp}
	})
	waitState(t, parts, StateDTLSFailed)
}

func bindingRequest(t *testing.T, username, pwd string, fingerprint bool) []byte {
	t.Helper()
	setters := []stun.Setter{stun.TransactionID, stun.BindingRequest, stun.NewUsername(username), stun.NewShortTermIntegrity(pwd)}
	if fingerprint {
		setters = append(setters, stun.Fingerprint)
	}
	m, err := stun.Build(setters...)
	if err != nil {
		t.Fatal(err)
	}
	return m.Raw
}

// sendRaw sends b to the server from a fresh socket and, if wantReply,
// returns the reply.
func sendRaw(t *testing.T, to netip.AddrPort, b []byte, wantReply bool) *stun.Message {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
	if !wantReply {
		return nil
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	m := &stun.Message{Raw: buf[:n]}
	if err := m.Decode(); err != nil {
		t.Fatal(err)
	}
	var xor stun.XORMappedAddress
	if err := xor.GetFrom(m); err != nil {
		t.Fatalf("reply without XOR-MAPPED-ADDRESS: %v", err)
	}
	if got := conn.LocalAddr().(*net.UDPAddr); !xor.IP.Equal(got.IP) || xor.Port != got.Port {
		t.Fatalf("XOR-MAPPED-ADDRESS %v, want %v", xor, got)
	}
	return m
}

func waitDrop(t *testing.T, ep *Endpoint, r DropReason, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ep.Drops()[r] < want {
		if time.Now().After(deadline) {
			t.Fatalf("%v drops %d, want %d", r, ep.Drops()[r], want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBadSTUN: checks that do not authenticate are dropped and counted by
// reason, and a good one is answered with the sender's address, signed.
func TestBadSTUN(t *testing.T) {
	var counted [NumDropReasons]atomic.Uint64
	s := newServer(t, func(c *Config) { c.OnDrop = func(r DropReason) { counted[r].Add(1) } })
	sess, err := s.ep.NewSession(SessionConfig{LocalUfrag: "local", LocalPwd: "localpwdlocalpwdlocalpwd", RemoteUfrag: "remote",
		Role: DTLSServer, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := s.ep.NewSession(SessionConfig{LocalUfrag: "local", LocalPwd: "x", RemoteUfrag: "y", Role: DTLSServer, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}}); err == nil {
		t.Fatal("a second session took the same ufrag")
	}
	cases := []struct {
		name string
		b    []byte
		want DropReason
	}{
		{"garbage", []byte{0, 1, 0, 0, 1, 2, 3}, DropSTUNMalformed},
		{"unknown ufrag", bindingRequest(t, "nobody:remote", "localpwdlocalpwdlocalpwd", true), DropSTUNUnknownUfrag},
		{"wrong remote ufrag", bindingRequest(t, "local:other", "localpwdlocalpwdlocalpwd", true), DropSTUNBadUsername},
		{"no colon", bindingRequest(t, "local", "localpwdlocalpwdlocalpwd", true), DropSTUNBadUsername},
		{"wrong pwd", bindingRequest(t, "local:remote", "wrongpwdwrongpwdwrongpwd", true), DropSTUNBadIntegrity},
		{"no fingerprint", bindingRequest(t, "local:remote", "localpwdlocalpwdlocalpwd", false), DropSTUNBadFingerprint},
		{"indication", mustBuild(t, stun.TransactionID, stun.NewType(stun.MethodBinding, stun.ClassIndication), stun.Fingerprint), DropSTUNIndication},
		{"response", mustBuild(t, stun.TransactionID, stun.BindingSuccess, stun.Fingerprint), DropSTUNNotRequest},
		{"DTLS from a stranger", []byte{22, 254, 253, 0, 0}, DropUnknownAddress},
		{"SRTP from a stranger", make([]byte, 40), DropUnknownPacket},
	}
	cases[len(cases)-1].b[0] = 0x80
	cases[len(cases)-1].want = DropUnknownAddress
	for _, tc := range cases {
		before := s.ep.Drops()[tc.want]
		sendRaw(t, s.addr(), tc.b, false)
		waitDrop(t, s.ep, tc.want, before+1)
		// The endpoint counts a drop before it calls OnDrop, so the
		// callback's count may trail Drops() by a moment: wait for it.
		deadline := time.Now().Add(5 * time.Second)
		for counted[tc.want].Load() < before+1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := counted[tc.want].Load(); got != before+1 {
			t.Fatalf("%s: OnDrop counted %d, want %d", tc.name, got, before+1)
		}
	}
	sendRaw(t, s.addr(), []byte{70, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownPacket, 1)

	// A good check is answered, signed with the local pwd.
	m := sendRaw(t, s.addr(), bindingRequest(t, "local:remote", "localpwdlocalpwdlocalpwd", true), true)
	if m.Type != stun.BindingSuccess {
		t.Fatalf("reply %v", m.Type)
	}
	if err := stun.NewShortTermIntegrity("localpwdlocalpwdlocalpwd").Check(m); err != nil {
		t.Fatalf("reply integrity: %v", err)
	}
	if err := stun.Fingerprint.Check(m); err != nil {
		t.Fatalf("reply fingerprint: %v", err)
	}
}

func mustBuild(t testing.TB, setters ...stun.Setter) []byte {
	t.Helper()
	m, err := stun.Build(setters...)
	if err != nil {
		t.Fatal(err)
	}
	return m.Raw
}

// TestPionClientSNAP: a client that offers SCTP SNAP (a=sctp-init) gets
// an answer with the session's own, and its data channel opens without
// the association's 4-way handshake and carries messages both ways.
func TestPionClientSNAP(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true, func(se *webrtc.SettingEngine) { se.EnableSctpSnap(true) })
	sess, parts := connect(t, s, c)
	if sess.LocalSCTPInit() == nil {
		t.Fatal("the offer had a=sctp-init but the session has none to answer")
	}
	waitState(t, parts, StateConnected)
	var wg sync.WaitGroup
	startDCEcho(t, parts, c, &wg)
	dcRoundTrip(t, c, "snap")
	_ = sess.Close()
	wg.Wait()
}

// TestEarlyMedia: the client is the DTLS server, so its handshake ends
// first, and it sends RTP the moment it does, while the session's last
// flight has not yet given it keys. That packet is kept until the keys
// come and echoed, not dropped.
func TestEarlyMedia(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	sent := make(chan error, 1)
	c.pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateConnected {
			// Pion calls this holding the transport's lock, which the
			// write waits for: it goes out as the handshake returns.
			go func() {
				sent <- c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 7, Timestamp: 960}, Payload: []byte{9, 0xfc}})
			}()
		}
	})
	sess, parts := connect(t, s, c)
	if sess.cfg.Role != DTLSClient {
		t.Fatal("the session must be the DTLS client for the client to finish first")
	}
	waitState(t, parts, StateConnected)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	select {
	case p := <-c.echo:
		if p.SequenceNumber != 7 || p.Payload[0] != 9 {
			t.Fatalf("echo seq %d payload %x, want the first packet", p.SequenceNumber, p.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the packet sent as the client's handshake ended was not echoed (drops %v)", s.ep.Drops())
	}
	_ = sess.Close()
	wg.Wait()
}

// checkFrom sends the check b to the server from c and waits for its
// answer.
func checkFrom(t testing.TB, c *net.UDPConn, to netip.AddrPort, b []byte) {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("no answer: %v", err)
	}
}

func newSock(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func sockAddr(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// liteSession is a session with fixed credentials and no client: tests
// sign its checks themselves.
func liteSession(t testing.TB, s *server, mutate ...func(*SessionConfig)) *Session {
	t.Helper()
	cfg := SessionConfig{LocalUfrag: "local", LocalPwd: "localpwdlocalpwdlocalpwd", RemoteUfrag: "remote",
		Role: DTLSServer, Certificate: s.cert, Fingerprints: []Fingerprint{s.fp}}
	return newSession(t, s, cfg, mutate...)
}

// newSession makes a session on s with cfg, changed by mutate in order,
// and closes it when the test ends.
func newSession(t testing.TB, s *server, cfg SessionConfig, mutate ...func(*SessionConfig)) *Session {
	t.Helper()
	for _, m := range mutate {
		m(&cfg)
	}
	sess, err := s.ep.NewSession(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

func check(t testing.TB, username, pwd string, nominate bool) []byte {
	t.Helper()
	setters := []stun.Setter{stun.TransactionID, stun.BindingRequest, stun.NewUsername(username)}
	if nominate {
		setters = append(setters, stun.RawAttribute{Type: stun.AttrUseCandidate})
	}
	setters = append(setters, stun.NewShortTermIntegrity(pwd), stun.Fingerprint)
	return mustBuild(t, setters...)
}

// TestReplayDoesNotRedirect: a captured nominating check replayed byte for
// byte from another address is answered but does not move the session's
// media there, nor teach that address; a valid non-nominating check from
// another address does not move it either; before the client's media has
// begun, a fresh nominating one does (after, TestOldReplayAfterMedia).
func TestReplayDoesNotRedirect(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim, attacker, other := newSock(t), newSock(t), newSock(t)
	nom := check(t, user, pwd, true)
	checkFrom(t, victim, s.addr(), nom)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("remote %v after the nominating check, want %v", got, sockAddr(victim))
	}
	checkFrom(t, attacker, s.addr(), nom)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a replayed check from %v moved the session's media to %v", sockAddr(attacker), got)
	}
	if s.ep.session(sockAddr(attacker)) != nil {
		t.Fatal("a replayed check taught its address")
	}
	checkFrom(t, other, s.addr(), check(t, user, pwd, false))
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a non-nominating check moved the session to %v", got)
	}
	if s.ep.session(sockAddr(other)) != sess {
		t.Fatal("a valid check did not teach its address")
	}
	checkFrom(t, other, s.addr(), check(t, user, pwd, true))
	if got := sess.RemoteAddr(); got != sockAddr(other) {
		t.Fatalf("a fresh nominating check from %v left the session on %v", sockAddr(other), got)
	}
}

// TestOldReplayAfterMedia: once the client's SRTP has authenticated, a
// captured nominating check older than the transaction-ID ring, replayed
// from another address, is answered and counted (MoveDeferred) but moves
// nothing and refreshes no consent, nor does the client's SRTP replayed
// from there; the client's fresh SRTP from a new address that a check
// came from (a NAT rebinding) moves the media, and a late packet from the
// address it left does not move it back.
func TestOldReplayAfterMedia(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim, attacker, rebound := newSock(t), newSock(t), newSock(t)
	captured := check(t, user, pwd, true)
	checkFrom(t, victim, s.addr(), captured)
	p := keySession(t, sess)
	rtpFrom := func(c *net.UDPConn) []byte { t.Helper(); return p.sendFrom(t, s, sess, c) }
	last := rtpFrom(victim) // the media has begun
	// The client's next txRing checks push the captured one out of the
	// ring.
	for range txRing {
		checkFrom(t, victim, s.addr(), check(t, user, pwd, true))
	}
	seen, moves := sess.lastSeen.Load(), s.ep.Moves()
	checkFrom(t, attacker, s.addr(), captured)
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d: the replay did not get past the ring", got, moves[MoveDeferred]+1)
	}
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a replayed check older than the ring moved the media to %v", got)
	}
	if sess.lastSeen.Load() != seen {
		t.Fatal("a replayed check from another address refreshed consent")
	}
	// The client's last SRTP packet replayed from the attacker's address
	// fails the replay window: it confirms nothing.
	auth := s.ep.Drops()[DropSRTPAuth]
	if _, err := attacker.WriteToUDPAddrPort(last, s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropSRTPAuth, auth+1)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("replayed SRTP moved the media to %v", got)
	}
	rtpFrom(victim)
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("the client's own SRTP left the media on %v", got)
	}

	// A rebinding: the client's consent check (not nominating) and then
	// its SRTP come from a new port.
	checkFrom(t, rebound, s.addr(), check(t, user, pwd, false))
	if got := sess.RemoteAddr(); got != sockAddr(victim) {
		t.Fatalf("a check alone moved the media to %v", got)
	}
	rtpFrom(rebound)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("the client's SRTP from its new port left the media on %v", got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
	// A late packet from the old port moves nothing back.
	rtpFrom(victim)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("a late packet from the old port moved the media back to %v", got)
	}
}

// TestCandidateLapses: a candidate confirms only within its window after
// its check (candidateTTL): the client's SRTP from an address whose check
// is older than that moves nothing, so a replayed check is good for one
// short race. The same steps with the default window (2 s) move the
// media. The short window is a test's; the wait is longer than it, so
// the outcome does not depend on the machine's speed.
func TestCandidateLapses(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	const wait = 20 * time.Millisecond
	for _, tc := range []struct {
		name  string
		ttl   time.Duration // 0: candidateTTL
		moves bool
	}{
		{name: "lapsed", ttl: time.Millisecond, moves: false},
		{name: "default", moves: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t)
			sess := liteSession(t, s, func(c *SessionConfig) { c.candidateTTL = tc.ttl })
			sel, other := newSock(t), newSock(t)
			checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
			p := keySession(t, sess)
			p.sendFrom(t, s, sess, sel) // the media has begun
			checkFrom(t, other, s.addr(), check(t, user, pwd, true))
			time.Sleep(wait)
			p.sendFrom(t, s, sess, other)
			want, confirmed := sockAddr(sel), uint64(0)
			if tc.moves {
				want, confirmed = sockAddr(other), 1
			}
			if got := sess.RemoteAddr(); got != want {
				t.Fatalf("remote %v after SRTP from the candidate %v, %v after its check; want %v", got, sockAddr(other), wait, want)
			}
			if got := s.ep.Moves()[MoveConfirmed]; got != confirmed {
				t.Fatalf("confirmed moves %d, want %d", got, confirmed)
			}
		})
	}
}

// TestSRTCPConfirmsMove: the client's SRTCP alone begins its media and
// confirms a move, as its SRTP does (a client that sends no RTP still
// reports on what it receives, RFC 3550 §6.2).
func TestSRTCPConfirmsMove(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	s := newServer(t)
	rtcpIn := make(chan struct{}, 1)
	sess := liteSession(t, s, func(c *SessionConfig) {
		c.OnRTCP = func([]byte) {
			select {
			case rtcpIn <- struct{}{}:
			default:
			}
		}
	})
	sel, rebound := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	p := keySession(t, sess)
	// rtcpFrom sends the client's next SRTCP packet from c and waits
	// for the session to hand it to OnRTCP.
	rtcpFrom := func(c *net.UDPConn) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort(p.nextRTCP(t, nil), s.addr()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rtcpIn:
		case <-time.After(5 * time.Second):
			t.Fatalf("SRTCP from %v did not reach OnRTCP (drops %v)", sockAddr(c), s.ep.Drops())
		}
	}
	rtcpFrom(sel)
	moves := s.ep.Moves()
	checkFrom(t, rebound, s.addr(), check(t, user, pwd, true))
	// Deferred, not nominated: the SRTCP began the client's media.
	if got := s.ep.Moves(); got[MoveDeferred] != moves[MoveDeferred]+1 || got[MoveNominated] != moves[MoveNominated] {
		t.Fatalf("moves %v after a nominating check from a new address, then %v: want it deferred", moves, got)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("a check alone moved the media to %v", got)
	}
	rtcpFrom(rebound)
	if got := sess.RemoteAddr(); got != sockAddr(rebound) {
		t.Fatalf("the client's SRTCP from %v left the media on %v", sockAddr(rebound), got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
}

// TestRestartAfterMedia: after an ICE restart in a call, a check of the
// new generation from a new address (the client's new path) makes it a
// candidate, and the client's SRTP from there moves the media, as for a
// NAT rebinding (signaling.md, "ICE restart").
func TestRestartAfterMedia(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	sel, next := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	p := keySession(t, sess)
	p.sendFrom(t, s, sess, sel) // the media has begun
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	moves := s.ep.Moves()
	checkFrom(t, next, s.addr(), check(t, "local2:remote2", "local2pwdlocal2pwdlocal2", true))
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d", got, moves[MoveDeferred]+1)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("the new generation's check alone moved the media to %v", got)
	}
	p.sendFrom(t, s, sess, next)
	if got := sess.RemoteAddr(); got != sockAddr(next) {
		t.Fatalf("the client's SRTP from the new generation's address %v left the media on %v", sockAddr(next), got)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != moves[MoveConfirmed]+1 {
		t.Fatalf("confirmed moves %d, want %d", got, moves[MoveConfirmed]+1)
	}
}

// TestRestartVoidsOldCandidates: a candidate of the generation before an
// ICE restart confirms nothing after it. The restart forgets its address,
// so the client's SRTP from there is dropped (unknown_address); and when a
// check of the old generation races the restart (the read loop took the
// credentials before Restart and learns the address and makes it a
// candidate after Restart forgot the old ones; the test's goroutine plays
// the read loop for that packet and the SRTP after it), the client's SRTP
// from that address is taken but moves nothing.
func TestRestartVoidsOldCandidates(t *testing.T) {
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	s := newServer(t)
	sess := liteSession(t, s)
	sel, old := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	p := keySession(t, sess)
	p.sendFrom(t, s, sess, sel) // the media has begun
	checkFrom(t, old, s.addr(), check(t, user, pwd, true))
	// The read loop hands this packet to the media reader after it took
	// the check: the candidates are the test's from here.
	p.sendFrom(t, s, sess, sel)
	oldCred := sess.credentials()
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	moves := s.ep.Moves()
	unknown := s.ep.Drops()[DropUnknownAddress]
	if _, err := old.WriteToUDPAddrPort(p.next(t, nil), s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropUnknownAddress, unknown+1)

	raced := netip.MustParseAddrPort("127.0.0.1:9")
	s.ep.learn(sess, raced)
	sess.candidate(raced, oldCred)
	var rd reader
	s.ep.handle(&rd, p.next(t, nil), raced)
	select {
	case bp := <-sess.rtpq:
		putBuf(bp)
	default:
		t.Fatalf("the client's SRTP from %v was not taken (drops %v)", raced, s.ep.Drops())
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("SRTP from a candidate of the old generation moved the media to %v", got)
	}
	if got := s.ep.Moves(); got != moves {
		t.Fatalf("moves %v, then %v", moves, got)
	}
}

// TestRebindAfterOldReplay: a Pion client in a call. Its first
// nominating check, captured on the path and replayed from another
// address once it is older than the transaction-ID ring, is answered but
// the client's echoes keep coming; then the client's NAT gives it a new
// port, and the session follows it there (its next consent check, then
// its RTP) without signaling.
func TestRebindAfterOldReplay(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	sess, _ := connectPath(t, s, c, p)
	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	sendUntilEcho(t, c, 1)
	old := p.backAddr()
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("remote %v, want the path's %v", got, old)
	}
	captured := p.firstNom.Load()
	if captured == nil {
		t.Fatal("the client sent no nominating check through the path")
	}
	// Fresh checks with the session's credentials push the captured one
	// out of the ring, as txRing of the client's consent checks would
	// (Pion sends one every 2 s).
	filler := newSock(t)
	user := sess.cfg.LocalUfrag + ":" + sess.cfg.RemoteUfrag
	for range txRing {
		checkFrom(t, filler, s.addr(), check(t, user, sess.cfg.LocalPwd, false))
	}
	attacker := newSock(t)
	moves := s.ep.Moves()
	checkFrom(t, attacker, s.addr(), *captured)
	if got := s.ep.Moves()[MoveDeferred]; got != moves[MoveDeferred]+1 {
		t.Fatalf("deferred moves %d, want %d: the replay did not get past the ring", got, moves[MoveDeferred]+1)
	}
	// The session takes a check before it answers it.
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("the replayed check moved the media to %v", got)
	}
	sendUntilEcho(t, c, 2)
	if got := s.ep.Moves(); got[MoveConfirmed] != moves[MoveConfirmed] || got[MoveNominated] != moves[MoveNominated] {
		t.Fatalf("moves %v, then %v: the media moved", moves, got)
	}
	if got := sess.RemoteAddr(); got != old {
		t.Fatalf("the media is on %v, want the client's %v", got, old)
	}

	confirmed := s.ep.Moves()[MoveConfirmed]
	p.rebind(t)
	rebindAt := time.Now()
	sendUntilEcho(t, c, 3)
	t.Logf("echoes resumed %v after the rebinding", time.Since(rebindAt).Round(time.Millisecond))
	if got, want := sess.RemoteAddr(), p.backAddr(); got != want {
		t.Fatalf("remote %v after the rebinding, want %v", got, want)
	}
	if got := s.ep.Moves()[MoveConfirmed]; got != confirmed+1 {
		t.Fatalf("confirmed moves %d, want %d", got, confirmed+1)
	}
	_ = sess.Close()
	wg.Wait()
}

// TestEvictKeepsSelected: a session that learns more than maxLearned
// addresses forgets the oldest but the selected one, whose SRTP and DTLS
// must still reach it.
func TestEvictKeepsSelected(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	sel := newSock(t)
	checkFrom(t, sel, s.addr(), check(t, user, pwd, true))
	var others []*net.UDPConn
	for range maxLearned {
		c := newSock(t)
		checkFrom(t, c, s.addr(), check(t, user, pwd, false))
		others = append(others, c)
	}
	if got := sess.RemoteAddr(); got != sockAddr(sel) {
		t.Fatalf("remote %v, want the nominated %v", got, sockAddr(sel))
	}
	if s.ep.session(sockAddr(sel)) != sess {
		t.Fatal("the selected address was evicted: its SRTP and DTLS would drop as unknown_address")
	}
	if s.ep.session(sockAddr(others[0])) != nil {
		t.Fatal("the oldest unselected address was not evicted")
	}
	// SRTP from the selected address reaches the session (not yet
	// keyed: kept for the keys, not dropped as unknown_address).
	before := s.ep.Drops()[DropUnknownAddress]
	rtpPkt := make([]byte, 40)
	rtpPkt[0] = 0x80
	if _, err := sel.WriteToUDPAddrPort(rtpPkt, s.addr()); err != nil {
		t.Fatal(err)
	}
	// A DTLS datagram from a stranger after it, to know the read loop
	// has handled the SRTP.
	sendRaw(t, s.addr(), []byte{22, 254, 253, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownAddress, before+1)
	if got := s.ep.Drops()[DropUnknownAddress]; got != before+1 {
		t.Fatalf("SRTP from the selected address dropped as unknown_address")
	}
}

// TestDTLSGarbageKeepsNoConsent: datagrams in the DTLS range from the
// client's address that do not authenticate do not refresh consent: the
// session still fails once the client's real traffic stops (RFC 7675).
func TestDTLSGarbageKeepsNoConsent(t *testing.T) {
	s, p, _, parts := connectCuttable(t, true, 200*time.Millisecond, 600*time.Millisecond)
	p.cut.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// From the client's address as the server sees it (the path's
		// back socket): an application data record with a bad MAC, and
		// a handshake record.
		garbage := [][]byte{
			{23, 254, 253, 0, 1, 0, 0, 0, 0, 0, 9, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8},
			{22, 254, 253, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0},
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, _ = p.back.Load().WriteToUDPAddrPort(garbage[i%2], s.addr())
		}
	}()
	waitState(t, parts, StateFailed)
	close(stop)
	wg.Wait()
}

// TestRestartForgetsOldAddresses: an ICE restart forgets the addresses
// learned from the old generation's checks but the selected one, which
// keeps carrying DTLS and SRTP until the new generation moves the media
// (a nominating check before the client's media begins; after, the
// client's SRTP or SRTCP from a candidate: TestRestartAfterMedia).
func TestRestartForgetsOldAddresses(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	sel, other := newSock(t), newSock(t)
	checkFrom(t, sel, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	checkFrom(t, other, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", false))
	if s.ep.session(sockAddr(other)) != sess {
		t.Fatal("a valid check did not teach its address")
	}
	if err := sess.Restart("local2", "local2pwdlocal2pwdlocal2", "remote2"); err != nil {
		t.Fatal(err)
	}
	if s.ep.session(sockAddr(other)) != nil {
		t.Fatal("an address of the old generation is still mapped after the restart")
	}
	if s.ep.session(sockAddr(sel)) != sess || sess.RemoteAddr() != sockAddr(sel) {
		t.Fatal("the restart dropped the selected address")
	}
	// The old generation's credentials are refused, the new ones work.
	before := s.ep.Drops()[DropSTUNUnknownUfrag]
	sendRaw(t, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", false), false)
	waitDrop(t, s.ep, DropSTUNUnknownUfrag, before+1)
	checkFrom(t, other, s.addr(), check(t, "local2:remote2", "local2pwdlocal2pwdlocal2", false))
	// The new local ufrag with the old remote one: not this generation.
	before = s.ep.Drops()[DropSTUNBadUsername]
	sendRaw(t, s.addr(), check(t, "local2:remote", "local2pwdlocal2pwdlocal2", false), false)
	waitDrop(t, s.ep, DropSTUNBadUsername, before+1)
	_ = sess.Close()
	if err := sess.Restart("local3", "local3pwdlocal3pwdlocal3", "remote3"); err != ErrClosed {
		t.Fatalf("Restart after Close: %v, want ErrClosed", err)
	}
}

// TestHandshakeTimeout: a client that nominates and never starts DTLS
// fails the session's handshake after HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	s := newServer(t)
	states := make(chan State, 8)
	liteSession(t, s, func(c *SessionConfig) {
		c.HandshakeTimeout = 100 * time.Millisecond
		c.OnState = func(st State) { states <- st }
	})
	checkFrom(t, newSock(t), s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	for {
		select {
		case st := <-states:
			if st == StateDTLSFailed {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the handshake did not time out")
		}
	}
}

// TestFingerprintStrongestHash: the client's certificate is checked
// against the fingerprint of the strongest hash function offered; MD5 is
// not accepted.
func TestFingerprintStrongestHash(t *testing.T) {
	s := newServer(t)
	der := s.cert.Certificate[0]
	good256 := sha256.Sum256(der)
	good1 := sha1.Sum(der)
	goodMD5 := md5.Sum(der)
	bad := func(d []byte) []byte { d = bytes.Clone(d); d[0] ^= 0xff; return d }
	cases := []struct {
		name string
		fps  []Fingerprint
		ok   bool
	}{
		{"sha-256", []Fingerprint{{"sha-256", good256[:]}}, true},
		{"SHA-256 upper case", []Fingerprint{{"SHA-256", good256[:]}}, true},
		{"sha-1", []Fingerprint{{"sha-1", good1[:]}}, true},
		{"md5 only", []Fingerprint{{"md5", goodMD5[:]}}, false},
		{"wrong sha-256, right md5", []Fingerprint{{"sha-256", bad(good256[:])}, {"md5", goodMD5[:]}}, false},
		{"wrong sha-256, right sha-1", []Fingerprint{{"sha-1", good1[:]}, {"sha-256", bad(good256[:])}}, false},
		{"right sha-256, wrong sha-1", []Fingerprint{{"sha-1", bad(good1[:])}, {"sha-256", good256[:]}}, true},
		{"unknown hash", []Fingerprint{{"sha3-256", good256[:]}}, false},
	}
	for _, tc := range cases {
		sess := &Session{cfg: SessionConfig{Fingerprints: tc.fps}}
		err := sess.verifyCertificate([][]byte{der}, nil)
		if (err == nil) != tc.ok {
			t.Errorf("%s: verify %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestSRTPReplay: an SRTP packet the session already decrypted, sent again
// from the client's address, is dropped as srtp_auth (the replay window,
// RFC 3711 §3.3.2).
func TestSRTPReplay(t *testing.T) {
	s := newServer(t)
	c := newClient(t, false)
	p := newPath(t, s.addr(), c)
	sess, _ := connectPath(t, s, c, p)
	var wg sync.WaitGroup
	wg.Add(1)
	go echoRTP(sess, &wg)
	sendUntilEcho(t, c, 5)
	captured := p.lastRTP.Load()
	if captured == nil {
		t.Fatal("no SRTP went through the path")
	}
	before := s.ep.Drops()[DropSRTPAuth]
	if _, err := p.back.Load().WriteToUDPAddrPort(*captured, s.addr()); err != nil {
		t.Fatal(err)
	}
	waitDrop(t, s.ep, DropSRTPAuth, before+1)
	_ = sess.Close()
	wg.Wait()
}

// TestLargeDataChannelMessages: messages of 60 KB (a session.update with
// tool schemas), sent back to back, come as bursts of SCTP packets that
// the session's DTLS queue holds: each is echoed whole, and nothing is
// dropped as dtls_queue_full.
func TestLargeDataChannelMessages(t *testing.T) {
	s := newServer(t)
	c := newClient(t, true)
	sess, parts := connect(t, s, c)
	waitState(t, parts, StateConnected)
	var wg sync.WaitGroup
	startDCEcho(t, parts, c, &wg)
	var msgs []string
	for i := range 4 {
		m := strings.Repeat(string(rune('a'+i)), 60<<10)
		msgs = append(msgs, m)
		if err := c.dc.SendText(m); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range msgs {
		select {
		case got := <-c.msgs:
			if got != "echo:"+m {
				t.Fatalf("message %d: echo of %d bytes, want %d", i, len(got), len("echo:"+m))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("message %d not echoed (drops %v)", i, s.ep.Drops())
		}
	}
	if n := s.ep.Drops()[DropDTLSQueueFull]; n != 0 {
		t.Fatalf("%d datagrams dropped as dtls_queue_full", n)
	}
	_ = sess.Close()
	wg.Wait()
}

// TestBadCheckTeachesNothing: a nominating check with a bad
// MESSAGE-INTEGRITY or FINGERPRINT from a new address is dropped without
// teaching that address, moving the session or refreshing its consent.
func TestBadCheckTeachesNothing(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	const user, pwd = "local:remote", "localpwdlocalpwdlocalpwd"
	victim := newSock(t)
	checkFrom(t, victim, s.addr(), check(t, user, pwd, true))
	seen := sess.lastSeen.Load()
	badPwd := check(t, user, "wrongpwdwrongpwdwrongpwd", true)
	badFP := check(t, user, pwd, true)
	badFP[len(badFP)-1] ^= 0xff // the FINGERPRINT's CRC
	for _, tc := range []struct {
		b    []byte
		want DropReason
	}{{badPwd, DropSTUNBadIntegrity}, {badFP, DropSTUNBadFingerprint}} {
		attacker := newSock(t)
		before := s.ep.Drops()[tc.want]
		if _, err := attacker.WriteToUDPAddrPort(tc.b, s.addr()); err != nil {
			t.Fatal(err)
		}
		waitDrop(t, s.ep, tc.want, before+1)
		if s.ep.session(sockAddr(attacker)) != nil {
			t.Fatalf("%v: the check taught its address", tc.want)
		}
		if got := sess.RemoteAddr(); got != sockAddr(victim) {
			t.Fatalf("%v: the check moved the session to %v", tc.want, got)
		}
		if sess.lastSeen.Load() != seen {
			t.Fatalf("%v: the check refreshed consent", tc.want)
		}
		// And DTLS from it is still from a stranger.
		before = s.ep.Drops()[DropUnknownAddress]
		if _, err := attacker.WriteToUDPAddrPort([]byte{22, 254, 253, 0, 0}, s.addr()); err != nil {
			t.Fatal(err)
		}
		waitDrop(t, s.ep, DropUnknownAddress, before+1)
	}
}

// TestEarlySRTPBounded: SRTP from the selected address before the DTLS
// handshake gave keys is kept up to earlyMax packets; the rest are dropped
// as srtp_not_ready.
func TestEarlySRTPBounded(t *testing.T) {
	s := newServer(t)
	liteSession(t, s)
	c := newSock(t)
	checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	pkt := make([]byte, 40)
	pkt[0], pkt[1] = 0x80, 111
	for range earlyMax + 1 {
		if _, err := c.WriteToUDPAddrPort(pkt, s.addr()); err != nil {
			t.Fatal(err)
		}
	}
	waitDrop(t, s.ep, DropSRTPNotReady, 1)
	// Sync on the read loop, then check that only the one past earlyMax
	// was dropped.
	before := s.ep.Drops()[DropUnknownPacket]
	sendRaw(t, s.addr(), []byte{70, 0, 0}, false)
	waitDrop(t, s.ep, DropUnknownPacket, before+1)
	if n := s.ep.Drops()[DropSRTPNotReady]; n != 1 {
		t.Fatalf("srtp_not_ready %d, want 1 (the packet past the %d kept)", n, earlyMax)
	}
}

// TestCloseRacesHandshake: Close right after the nominating check, while
// the session's goroutine starts the DTLS handshake, returns, leaks no
// goroutine (TestMain's goleak) and races nothing (-race).
func TestCloseRacesHandshake(t *testing.T) {
	s := newServer(t)
	c := newSock(t)
	for i := range 100 {
		sess := liteSession(t, s, func(sc *SessionConfig) {
			if i%2 == 0 {
				sc.Role = DTLSClient // sends its ClientHello at once
			}
		})
		checkFrom(t, c, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
		if err := sess.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQueuesFull: DTLS that nobody reads yet (from an address the session
// learned, before its handshake has started) queues up to dtlsQueueBytes,
// then drops as dtls_queue_full; RTP that the media reader does not take
// drops as rtp_queue_full past SessionConfig.RTPQueue.
func TestQueuesFull(t *testing.T) {
	t.Run("dtls", func(t *testing.T) {
		s := newServer(t)
		sess := liteSession(t, s)
		// The address is learned as from a check, but the check's
		// handshake start is left out, so nothing reads the queue.
		c := newSock(t)
		s.ep.learn(sess, sockAddr(c))
		rec := make([]byte, 1200)
		rec[0], rec[1], rec[2] = 22, 254, 253
		for i := 0; s.ep.Drops()[DropDTLSQueueFull] == 0; i++ {
			if i == 5000 {
				t.Fatalf("no dtls_queue_full after %d records of %d bytes", i, len(rec))
			}
			if _, err := c.WriteToUDPAddrPort(rec, s.addr()); err != nil {
				t.Fatal(err)
			}
			if i%64 == 63 {
				time.Sleep(time.Millisecond) // let the socket buffer drain
			}
		}
		sess.dtls.mu.Lock()
		held := sess.dtls.qBytes
		sess.dtls.mu.Unlock()
		if held > dtlsQueueBytes || held < dtlsQueueBytes-len(rec) {
			t.Fatalf("the queue holds %d bytes when full, want about %d", held, dtlsQueueBytes)
		}
	})
	t.Run("rtp", func(t *testing.T) {
		s := newServer(t)
		c := newClient(t, false)
		_, parts := connect(t, s, c, func(sc *SessionConfig) { sc.RTPQueue = 2 })
		waitState(t, parts, StateConnected)
		for seq := uint16(0); s.ep.Drops()[DropRTPQueueFull] == 0; seq++ {
			if seq == 1000 {
				t.Fatal("no rtp_queue_full with nobody reading")
			}
			if err := c.track.WriteRTP(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq}, Payload: []byte{1}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	})
}
