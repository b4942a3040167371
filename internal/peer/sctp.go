package peer

import (
	"net"

	"github.com/pion/datachannel"
	"github.com/pion/sctp"
)

// Data channels (RFC 8831) over SCTP over DTLS (RFC 8261).
//
// Like Pion's SCTPTransport, the session opens the association as an SCTP
// client whatever its DTLS role: both ends send INIT and SCTP resolves the
// collision (RFC 9260 §5.2.4). Channels are opened by the client with DCEP
// (RFC 8832) and handed over detached: the caller reads them with a buffer
// of its own choosing.

// sctpMTU is the largest SCTP packet sent, Pion's and browsers' choice:
// it leaves room for DTLS and UDP/IP headers in a 1280-byte IPv6 path.
const sctpMTU = 1200

// sctpOptions are the association's options over conn (nil: for the
// SNAP token, which only needs the association parameters).
func (s *Session) sctpOptions(conn net.Conn) []sctp.ClientOption {
	opts := []sctp.ClientOption{
		sctp.WithMTU(sctpMTU),
		sctp.WithMaxMessageSize(uint32(s.cfg.MaxMessageSize)),
		sctp.WithLoggerFactory(s.e.cfg.LoggerFactory),
	}
	if conn != nil {
		opts = append(opts, sctp.WithNetConn(conn))
	}
	return opts
}

// serveSCTP runs the association and accepts the client's data channels
// until the association ends.
func (s *Session) serveSCTP(conn net.Conn) {
	opts := s.sctpOptions(conn)
	if s.snap != nil {
		opts = append(opts, sctp.WithSNAP(s.snap, s.cfg.RemoteSCTPInit))
	}
	assoc, err := sctp.ClientContext(s.ctx, opts...)
	if err != nil {
		if !s.closing.Load() {
			s.e.log.Debug("peer: SCTP association failed", "ufrag", s.ufrag(), "err", err)
		}
		return
	}
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = assoc.Close()
		return
	}
	s.assoc = assoc
	s.mu.Unlock()
	s.sctpUp.Store(true)
	s.state(StateSCTPConnected)
	for {
		dc, err := datachannel.Accept(assoc, &datachannel.Config{LoggerFactory: s.e.cfg.LoggerFactory})
		if err != nil {
			return
		}
		if s.cfg.OnDataChannel != nil {
			s.cfg.OnDataChannel(dc)
		} else {
			_ = dc.Close()
		}
	}
}
