package peer

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
)

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

// TestPionClientWithDTLS13: an Endpoint that offers DTLS 1.3 serves a
// client that has only DTLS 1.2 (pion/dtls v3, Pion's webrtc), in either
// DTLS role: the handshake falls back to 1.2 (RFC 9147 §C) and media
// flows.
func TestPionClientWithDTLS13(t *testing.T) {
	for _, role := range []DTLSRole{DTLSClient, DTLSServer} {
		t.Run(map[DTLSRole]string{DTLSClient: "as DTLS client", DTLSServer: "as DTLS server"}[role], func(t *testing.T) {
			s := newServer(t, func(c *Config) { c.DTLSVersion = DTLS13 })
			c := newClient(t, true)
			sess, parts := connect(t, s, c, func(sc *SessionConfig) { sc.Role = role })
			waitState(t, parts, StateConnected)
			if v := sess.DTLSVersion(); v != DTLS12 {
				t.Errorf("negotiated DTLS %q, want 1.2", v)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go echoRTP(sess, &wg)
			sendUntilEcho(t, c, 1)
			_ = sess.Close()
			wg.Wait()
		})
	}
}
