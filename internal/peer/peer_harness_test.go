package peer

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
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
// answers there, stalling the handshake (TestPathStrangers).
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
	if sess.cfg.Role == DTLSServer { // a mutate's choice
		setup = "passive"
	}
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

func mustBuild(t testing.TB, setters ...stun.Setter) []byte {
	t.Helper()
	m, err := stun.Build(setters...)
	if err != nil {
		t.Fatal(err)
	}
	return m.Raw
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
