package e2e

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/pion/stun/v4"

	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// TestReplayedNominationFromSecondPort: mid-call, a nominating check the
// client sent is replayed byte for byte through the relay from another port
// of the client's IP (an attacker on the same Wi-Fi or behind the same
// CGNAT), which then keeps that port live with garbage RTP and more
// replays. The client's media must stay where it is: the check makes the
// port a candidate at most, and no SRTP from it ever authenticates
// (internal/peer, "Path selection"). Before the hop reported each port as
// it is, its rebinding latch moved the session's media to the replayer's
// port and kept it there.
func TestReplayedNominationFromSecondPort(t *testing.T) {
	var tap *checkTap
	s := startStackFront(t, 11, slog.New(slog.DiscardHandler), func(relay netip.AddrPort) netip.AddrPort {
		tap = newCheckTap(t, relay)
		return tap.addr()
	})
	done := callInBackground(t, s, 6*time.Second)
	captured := tap.nomination()
	if captured == nil {
		t.Fatal("the client sent no nominating check")
	}
	before := s.trx.PeerMoves()

	att, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.relay.PublicAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	go func() { // drain whatever the relay sends the replayer
		buf := make([]byte, 1500)
		for {
			if _, err := att.Read(buf); err != nil {
				return
			}
		}
	}()
	junk := append([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}, bytes.Repeat([]byte{0x5a}, 80)...)
	for i := range 30 {
		if i%5 == 0 {
			if _, err := att.Write(captured); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := att.Write(junk); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	res := <-done
	after := s.trx.PeerMoves()
	t.Logf("report: %s", res.r)
	t.Logf("peer moves before the replay %v, after the call %v", before, after)
	if res.err != nil || res.r.PayloadMismatches != 0 || !res.r.DataChannelEchoed {
		t.Fatalf("call: %v", res.err)
	}
	if after[peer.MoveNominated] != before[peer.MoveNominated] || after[peer.MoveConfirmed] != before[peer.MoveConfirmed] {
		t.Errorf("the session's media moved: peer moves %v before the replay, %v after", before, after)
	}
	// The client's audio kept coming back: nothing near the 3 s the
	// replayer held its port went missing.
	if res.r.MaxGapMS > 1000 {
		t.Errorf("the client's audio stopped for %.0f ms", res.r.MaxGapMS)
	}
	if lost := res.r.PacketsSent - res.r.PacketsReceived; lost > 50 {
		t.Errorf("%d of %d packets did not come back", lost, res.r.PacketsSent)
	}
}

// checkTap is a UDP forwarder for one client in front of the relay that
// keeps a copy of the first nominating Binding request (USE-CANDIDATE) the
// client sends: what an observer on the client's network captures.
type checkTap struct {
	ln   *net.UDPConn
	up   *net.UDPConn
	mu   sync.Mutex
	nom  []byte
	cli  netip.AddrPort
	got  chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func newCheckTap(t *testing.T, relay netip.AddrPort) *checkTap {
	ln, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(relay))
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	p := &checkTap{ln: ln, up: up, got: make(chan struct{})}
	p.wg.Add(2)
	go p.fromClient()
	go p.toClient()
	t.Cleanup(func() {
		_ = ln.Close()
		_ = up.Close()
		p.wg.Wait()
	})
	return p
}

func (p *checkTap) addr() netip.AddrPort { return p.ln.LocalAddr().(*net.UDPAddr).AddrPort() }

func (p *checkTap) fromClient() {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := p.ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		// The client is whoever sends Binding requests for it; anything
		// else from another address is a stray datagram for a port this
		// socket reuses (a past test's media) and is not forwarded, so
		// that it cannot take the client's place for the replies.
		m := &stun.Message{Raw: bytes.Clone(buf[:n])}
		check := stun.IsMessage(buf[:n]) && m.Decode() == nil && m.Type == stun.BindingRequest
		p.mu.Lock()
		if check {
			p.cli = from
		}
		client := from == p.cli
		p.mu.Unlock()
		if !client {
			continue
		}
		if check && m.Contains(stun.AttrUseCandidate) {
			p.once.Do(func() {
				p.mu.Lock()
				p.nom = m.Raw
				p.mu.Unlock()
				close(p.got)
			})
		}
		_, _ = p.up.Write(buf[:n])
	}
}

func (p *checkTap) toClient() {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, err := p.up.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		cli := p.cli
		p.mu.Unlock()
		_, _ = p.ln.WriteToUDPAddrPort(buf[:n], cli)
	}
}

// nomination returns the captured nominating check, or nil if none came
// within 5 s.
func (p *checkTap) nomination() []byte {
	select {
	case <-p.got:
	case <-time.After(5 * time.Second):
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nom
}
