package peer

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/srtp/v3"
)

// srtpPair is a session keyed with fixed SRTP keys (AEAD AES-128-GCM, RFC
// 7714) and the client's sending context for those keys, so that a test
// can make SRTP the session authenticates without a DTLS handshake.
type srtpPair struct {
	client *srtp.Context
	seq    uint16
	hdr    rtp.Header
	plain  []byte
	// rtcpHdr is EncryptRTCP's scratch header.
	rtcpHdr rtcp.Header
}

func keySession(t testing.TB, sess *Session) *srtpPair {
	t.Helper()
	key, salt := bytes.Repeat([]byte{7}, 16), bytes.Repeat([]byte{9}, 12)
	p := srtp.ProtectionProfileAeadAes128Gcm
	client, err := srtp.CreateContext(key, salt, p)
	if err != nil {
		t.Fatal(err)
	}
	local, err := srtp.CreateContext(bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 12), p)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := srtp.CreateContext(key, salt, p, srtp.SRTPReplayProtection(replayWindow), srtp.SRTCPReplayProtection(replayWindow))
	if err != nil {
		t.Fatal(err)
	}
	sess.setKeys(&srtpKeys{local: local, remote: remote})
	return &srtpPair{client: client, plain: make([]byte, 12+80)}
}

// next returns the client's next SRTP packet (an 80-byte Opus-sized
// payload), appended to dst[:0].
func (p *srtpPair) next(t testing.TB, dst []byte) []byte {
	p.seq++
	p.hdr = rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: p.seq, Timestamp: uint32(p.seq) * 960, SSRC: 0xc1}
	if _, err := p.hdr.MarshalTo(p.plain); err != nil {
		t.Fatal(err)
	}
	out, err := p.client.EncryptRTP(dst[:0], p.plain, &p.hdr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// nextRTCP returns the client's next SRTCP packet: a receiver report
// (RFC 3550 §6.4.2) about the session's stream, appended to dst[:0].
func (p *srtpPair) nextRTCP(t testing.TB, dst []byte) []byte {
	raw, err := rtcp.Marshal([]rtcp.Packet{&rtcp.ReceiverReport{SSRC: 0xc1, Reports: []rtcp.ReceptionReport{{SSRC: 0x5e}}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.client.EncryptRTCP(dst[:0], raw, &p.rtcpHdr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sendFrom sends the client's next SRTP packet from c to s and waits for
// sess's media reader to get it (the read loop has handled it then). It
// returns the packet.
func (p *srtpPair) sendFrom(t testing.TB, s *server, sess *Session, c *net.UDPConn) []byte {
	t.Helper()
	pkt := p.next(t, nil)
	if _, err := c.WriteToUDPAddrPort(pkt, s.addr()); err != nil {
		t.Fatal(err)
	}
	_ = sess.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	if _, err := sess.ReadRTP(buf); err != nil {
		t.Fatalf("SRTP from %v did not reach the media reader: %v (drops %v)", sockAddr(c), err, s.ep.Drops())
	}
	return pkt
}

// BenchmarkReadSRTP is the read loop's work for one SRTP packet from the
// client's selected address, past the socket read: demultiplex, look up
// the session by address, decrypt and authenticate (AES-128-GCM), check
// the replay window, queue for the media reader; the media reader's take
// is included. Packets are encrypted ahead in batches, outside the timer.
//
//	go test -run '^$' -bench ReadSRTP -count 10 ./internal/peer
func BenchmarkReadSRTP(b *testing.B) {
	s := newServer(b)
	sess := liteSession(b, s)
	client := newSock(b)
	checkFrom(b, client, s.addr(), check(b, "local:remote", "localpwdlocalpwdlocalpwd", true))
	p := keySession(b, sess)
	from := sockAddr(client)
	batch := make([][]byte, 1024)
	for i := range batch {
		batch[i] = make([]byte, 0, 256)
	}
	var rd reader
	i := len(batch)
	b.ReportAllocs()
	for b.Loop() {
		if i == len(batch) {
			b.StopTimer()
			for j := range batch {
				batch[j] = p.next(b, batch[j])
			}
			i = 0
			b.StartTimer()
		}
		s.ep.handle(&rd, batch[i], from)
		i++
		select {
		case bp := <-sess.rtpq:
			putBuf(bp)
		default:
			b.Fatalf("packet %d not queued (drops %v)", p.seq, s.ep.Drops())
		}
	}
}

// TestReadSRTPAllocs: an SRTP packet from the selected address allocates
// nothing in the read loop in the steady state.
func TestReadSRTPAllocs(t *testing.T) {
	s := newServer(t)
	sess := liteSession(t, s)
	client := newSock(t)
	checkFrom(t, client, s.addr(), check(t, "local:remote", "localpwdlocalpwdlocalpwd", true))
	p := keySession(t, sess)
	from := sockAddr(client)
	var rd reader
	pkts := make([][]byte, 300)
	for i := range pkts {
		pkts[i] = p.next(t, nil)
	}
	i := 0
	step := func() {
		s.ep.handle(&rd, pkts[i], from)
		i++
		putBuf(<-sess.rtpq)
	}
	for range 20 {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%v allocations per SRTP packet, want 0", n)
	}
	if d := s.ep.Drops(); d != ([NumDropReasons]uint64{}) {
		t.Fatalf("drops %v", d)
	}
}
