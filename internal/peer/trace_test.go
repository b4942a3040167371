package peer

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pion/logging"
	"github.com/pion/webrtc/v4"
)

// trace is a test's record of the events around a connection (session
// states, checks, the client's ICE and DTLS states, the DTLS handshake's
// datagrams), printed when a wait times out, so that a stall that happens
// once in many runs says where it stalled. Callbacks may run after the
// test has ended, where t.Logf would panic; they write here instead.
type trace struct {
	mu      sync.Mutex
	lines   []traceLine // the last traceMax
	next    int
	dropped int
	// kinds counts the lines added by addKind, by kind.
	kinds map[string]int
}

type traceLine struct {
	at   time.Time
	what string
}

// traceMax bounds a trace: the last lines are kept.
const traceMax = 400

func newTrace() *trace { return &trace{} }

func (tr *trace) add(format string, args ...any) {
	if tr == nil {
		return
	}
	l := traceLine{at: time.Now(), what: fmt.Sprintf(format, args...)}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.lines) < traceMax {
		tr.lines = append(tr.lines, l)
		return
	}
	tr.lines[tr.next] = l
	tr.next = (tr.next + 1) % traceMax
	tr.dropped++
}

// kindMax is how many lines of one kind a trace keeps (addKind).
const kindMax = 5

// addKind adds a line of a kind (a log message's format) that may come
// once per datagram: only the first kindMax of each kind, so that a flood
// does not push the rest out; the others are only counted (suppressed).
func (tr *trace) addKind(kind, format string, args ...any) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	if tr.kinds == nil {
		tr.kinds = make(map[string]int)
	}
	tr.kinds[kind]++
	n := tr.kinds[kind]
	tr.mu.Unlock()
	if n <= kindMax {
		tr.add(format, args...)
	}
}

// suppressed describes the lines addKind only counted.
func (tr *trace) suppressed() string {
	if tr == nil {
		return ""
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var sb strings.Builder
	for kind, n := range tr.kinds {
		if n > kindMax {
			fmt.Fprintf(&sb, "  (%d more like %q)\n", n-kindMax, kind)
		}
	}
	return sb.String()
}

func (tr *trace) snapshot() ([]traceLine, int) {
	if tr == nil {
		return nil, 0
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append(slices.Clone(tr.lines[tr.next:]), tr.lines[:tr.next]...), tr.dropped
}

// mergeTraces returns the lines of trs in time order, stamped with their
// offset from since, one a line.
func mergeTraces(since time.Time, trs ...*trace) string {
	var all []traceLine
	dropped := 0
	for _, tr := range trs {
		l, d := tr.snapshot()
		all = append(all, l...)
		dropped += d
	}
	slices.SortStableFunc(all, func(a, b traceLine) int { return a.at.Compare(b.at) })
	var sb strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&sb, "  (%d earlier lines dropped)\n", dropped)
	}
	for _, l := range all {
		fmt.Fprintf(&sb, "  %+9.3fs %s\n", l.at.Sub(since).Seconds(), l.what)
	}
	for _, tr := range trs {
		sb.WriteString(tr.suppressed())
	}
	return sb.String()
}

// traceDTLS records a datagram's DTLS records if it carries any but
// application data (the handshake, change_cipher_spec, alerts): dir says
// which way it went and where. Application data (SCTP) is not recorded.
func traceDTLS(tr *trace, dir string, addr netip.AddrPort, b []byte) {
	if tr == nil || len(b) == 0 || b[0] < 20 || b[0] > 22 {
		return
	}
	tr.add("dtls %s %v: %s", dir, addr, describeDTLS(b))
}

var handshakeTypes = map[byte]string{
	1: "client_hello", 2: "server_hello", 3: "hello_verify_request", 11: "certificate",
	12: "server_key_exchange", 13: "certificate_request", 14: "server_hello_done",
	15: "certificate_verify", 16: "client_key_exchange", 20: "finished",
}

// describeDTLS names the records of a DTLS datagram (RFC 6347 §4.1: a
// 13-byte header, content type, version, epoch, sequence number, length).
func describeDTLS(b []byte) string {
	var parts []string
	for len(b) >= 13 {
		typ, epoch, n := b[0], int(b[3])<<8|int(b[4]), int(b[11])<<8|int(b[12])
		body := b[13:]
		if n > len(body) {
			parts = append(parts, fmt.Sprintf("truncated(%d)", typ))
			break
		}
		switch {
		case typ == 20:
			parts = append(parts, "change_cipher_spec")
		case typ == 21 && epoch == 0 && n >= 2:
			parts = append(parts, fmt.Sprintf("alert(%d,%d)", body[0], body[1]))
		case typ == 21:
			parts = append(parts, fmt.Sprintf("alert(epoch %d)", epoch))
		case typ == 22 && epoch == 0 && n >= 12:
			name, ok := handshakeTypes[body[0]]
			if !ok {
				name = fmt.Sprintf("handshake(%d)", body[0])
			}
			seq := int(body[4])<<8 | int(body[5])
			parts = append(parts, fmt.Sprintf("%s#%d", name, seq))
		case typ == 22:
			parts = append(parts, fmt.Sprintf("handshake(epoch %d)", epoch))
		case typ == 23:
			parts = append(parts, "application_data")
		default:
			parts = append(parts, fmt.Sprintf("record(%d)", typ))
		}
		b = body[n:]
	}
	return strings.Join(parts, " ")
}

// sessionNow describes the session at this moment: whether its goroutine
// started (a nomination came), whether its DTLS connection exists, its
// keys, the client's silence, its addresses, what waits in its DTLS queue,
// and the Endpoint's drops.
func sessionNow(s *Session) string {
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	s.dtls.mu.Lock()
	queued := len(s.dtls.q)
	s.dtls.mu.Unlock()
	s.e.mu.RLock()
	learned := slices.Clone(s.learned)
	s.e.mu.RUnlock()
	var sb strings.Builder
	fmt.Fprintf(&sb, "session now: started %v, ice up %v, dtls conn %v, handshake ended %v, keys %v, media %v, silent for %v, remote %v, learned %v, dtls queued %d\n",
		s.started.Load(), s.iceUp.Load(), conn != nil, s.dtls.isReady(), s.keys.Load() != nil, s.media.Load(),
		time.Since(time.Unix(0, s.lastSeen.Load())).Round(time.Millisecond), s.remote(), learned, queued)
	fmt.Fprintf(&sb, "endpoint drops:")
	for r, n := range s.e.Drops() {
		if n > 0 {
			fmt.Fprintf(&sb, " %v=%d", DropReason(r), n)
		}
	}
	sb.WriteString("\n")
	return sb.String()
}

// clientNow describes the client at this moment: its ICE, DTLS and
// connection states, its selected pair and its candidate pairs' checks.
func clientNow(c *client) string {
	var sb strings.Builder
	dt := c.pc.SCTP().Transport()
	fmt.Fprintf(&sb, "client now: ice %v, dtls %v, connection %v", c.pc.ICEConnectionState(), dt.State(), c.pc.ConnectionState())
	if p, err := dt.ICETransport().GetSelectedCandidatePair(); err == nil && p != nil {
		fmt.Fprintf(&sb, ", selected %v", p)
	}
	sb.WriteString("\n")
	for _, st := range c.pc.GetStats() {
		if ps, ok := st.(webrtc.ICECandidatePairStats); ok {
			fmt.Fprintf(&sb, "client pair %s/%s: state %v nominated %v requests %d/%d responses %d/%d packets %d/%d\n",
				ps.LocalCandidateID, ps.RemoteCandidateID, ps.State, ps.Nominated,
				ps.RequestsSent, ps.RequestsReceived, ps.ResponsesSent, ps.ResponsesReceived, ps.PacketsSent, ps.PacketsReceived)
		}
		if cs, ok := st.(webrtc.ICECandidateStats); ok && cs.Type == webrtc.StatsTypeLocalCandidate {
			fmt.Fprintf(&sb, "client candidate %s: %s:%d\n", cs.ID, cs.IP, cs.Port)
		}
	}
	return sb.String()
}

// traceLogs is a pion/logging factory that writes the Pion libraries'
// warnings and errors (a discarded datagram, a failed write, a mux with no
// endpoint for a packet) to a trace, the first few of each message (the
// rest are counted: trace.addKind).
type traceLogs struct{ tr *trace }

func (f traceLogs) NewLogger(scope string) logging.LeveledLogger { return traceLogger{f.tr, scope} }

type traceLogger struct {
	tr    *trace
	scope string
}

func (traceLogger) Trace(string)          {}
func (traceLogger) Tracef(string, ...any) {}
func (traceLogger) Debug(string)          {}
func (traceLogger) Debugf(string, ...any) {}
func (traceLogger) Info(string)           {}
func (traceLogger) Infof(string, ...any)  {}
func (l traceLogger) Warn(msg string)     { l.tr.addKind(msg, "%s warning: %s", l.scope, msg) }
func (l traceLogger) Warnf(format string, args ...any) {
	l.tr.addKind(format, "%s warning: %s", l.scope, fmt.Sprintf(format, args...))
}
func (l traceLogger) Error(msg string) { l.tr.addKind(msg, "%s error: %s", l.scope, msg) }
func (l traceLogger) Errorf(format string, args ...any) {
	l.tr.addKind(format, "%s error: %s", l.scope, fmt.Sprintf(format, args...))
}

// kernelDrops describes the kernel's receive-side drops (the "drops"
// column of /proc/net/udp: a full receive buffer) and receive queues of
// the IPv4 UDP sockets bound to ports, so that a stall says whether
// datagrams were lost on a loaded machine. Linux only; elsewhere empty.
func kernelDrops(ports ...uint16) string {
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return ""
	}
	want := make(map[uint16]bool, len(ports))
	for _, p := range ports {
		want[p] = true
	}
	var sb strings.Builder
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 13 {
			continue
		}
		// local_address is hex "ADDR:PORT", tx_queue:rx_queue hex, drops
		// the last column.
		ip, port, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil || !want[uint16(p)] {
			continue
		}
		a, _ := strconv.ParseUint(ip, 16, 32) // in host (little-endian) order
		_, rxq, _ := strings.Cut(f[4], ":")
		rx, _ := strconv.ParseUint(rxq, 16, 64)
		fmt.Fprintf(&sb, "kernel: udp %v: drops %s, receive queue %d bytes\n",
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(a), byte(a >> 8), byte(a >> 16), byte(a >> 24)}), uint16(p)), f[len(f)-1], rx)
	}
	return sb.String()
}

// clientPorts returns the ports of the client's local candidates.
func clientPorts(c *client) []uint16 {
	var ports []uint16
	for _, st := range c.pc.GetStats() {
		if cs, ok := st.(webrtc.ICECandidateStats); ok && cs.Type == webrtc.StatsTypeLocalCandidate {
			ports = append(ports, uint16(cs.Port))
		}
	}
	return ports
}
