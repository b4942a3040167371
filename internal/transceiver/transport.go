package transceiver

import (
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// ICE-TCP (RFC 6544): a client whose network drops UDP reaches the relay
// over TCP, and the relay carries its packets over the same internal hop,
// typed DATA_TCP (docs/hop.md). hop.Conn reports such a client under its
// TCP form of address (hop.TCPAddr), so internal/peer keys its path apart
// from any UDP path and answers on the transport each check came in on;
// path selection moves media between them as between any two addresses
// (internal/peer, session.go "Path selection"). What the transceiver adds
// is the answer's passive TCP candidate and the metrics by transport.

// tcpIngress returns the ICE-TCP address to advertise beside UDP ingress
// in: Config.AdvertiseTCP for the relay VIP, the same port at a region's
// ingress IP; invalid without AdvertiseTCP.
func (c *Config) tcpIngress(in netip.AddrPort) netip.AddrPort {
	if !c.advertiseTCP.IsValid() {
		return netip.AddrPort{}
	}
	if in == c.advertise {
		return c.advertiseTCP
	}
	return netip.AddrPortFrom(in.Addr().Unmap(), c.advertiseTCP.Port())
}

// Transport labels of the metrics by transport: the transport of a
// session's selected path (peer.Session.RemoteAddr), or none before one.
const (
	transportUDP  = "udp"
	transportTCP  = "tcp"
	transportNone = "none"
)

// transportOf returns the transport label of a session's selected path.
func transportOf(sess *session) string {
	if sess.peer == nil {
		return transportNone
	}
	a := sess.peer.RemoteAddr()
	if !a.IsValid() {
		return transportNone
	}
	return hop.Transport(a)
}

// transportMetrics are the transceiver's metrics by transport, every
// series present from the first scrape:
//
//	switchboard_transceiver_sessions_by_transport{transport}              live sessions (udp, tcp, none: no path selected yet)
//	switchboard_transceiver_sessions_ended_by_transport_total{transport}  sessions ended, by the transport they ended on
//	switchboard_transceiver_connect_by_transport_seconds{transport}      offer to connected (ICE and DTLS), by the transport connected on
//	switchboard_transceiver_hop_datagrams_total{direction,transport}      client datagrams through the internal hop
//
// The share of calls ending on TCP is
// rate(…ended_by_transport_total{transport="tcp"}) over the sum.
type transportMetrics struct {
	ended   *prometheus.CounterVec
	connect *prometheus.HistogramVec
}

func newTransportMetrics(s *Server, reg prometheus.Registerer) *transportMetrics {
	m := &transportMetrics{
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_sessions_ended_by_transport_total",
			Help: "Sessions ended, by the transport of the path they ended on: udp, tcp (ICE-TCP through a relay), none (no path was ever selected).",
		}, []string{"transport"}),
		connect: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchboard_transceiver_connect_by_transport_seconds",
			Help:    "Time from the offer to connected (ICE and DTLS done, SRTP keys), by the transport of the path selected then (udp, tcp).",
			Buckets: prometheus.ExponentialBuckets(0.025, 2, 10),
		}, []string{"transport"}),
	}
	for _, tr := range []string{transportUDP, transportTCP, transportNone} {
		m.ended.WithLabelValues(tr)
	}
	for _, tr := range []string{transportUDP, transportTCP} {
		m.connect.WithLabelValues(tr)
	}
	if reg != nil {
		reg.MustRegister(m.ended, m.connect, &transportCollector{s: s,
			live: prometheus.NewDesc("switchboard_transceiver_sessions_by_transport",
				"Live sessions, by the transport of their selected path: udp, tcp (ICE-TCP through a relay), none (no path selected yet).", []string{"transport"}, nil),
			datagrams: prometheus.NewDesc("switchboard_transceiver_hop_datagrams_total",
				"Client datagrams through the internal hop, by direction (from_client, to_client) and the client's transport (udp, tcp).", []string{"direction", "transport"}, nil),
		})
	}
	return m
}

// connected records sess connecting, at its session's state change.
func (m *transportMetrics) connected(sess *session) {
	if tr := transportOf(sess); tr != transportNone {
		m.connect.WithLabelValues(tr).Observe(time.Since(sess.created).Seconds())
	}
}

// ended records sess ending, at its teardown.
func (m *transportMetrics) endedOn(sess *session) {
	m.ended.WithLabelValues(transportOf(sess)).Inc()
}

// transportCollector exports the live sessions and the hop's datagrams by
// transport at scrape time.
type transportCollector struct {
	s               *Server
	live, datagrams *prometheus.Desc
}

func (c *transportCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.live
	ch <- c.datagrams
}

func (c *transportCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	c.s.mu.Lock()
	for _, sess := range c.s.sessions {
		n[transportOf(sess)]++
	}
	c.s.mu.Unlock()
	for _, tr := range []string{transportUDP, transportTCP, transportNone} {
		ch <- prometheus.MustNewConstMetric(c.live, prometheus.GaugeValue, float64(n[tr]), tr)
	}
	st := c.s.HopStats()
	for _, d := range []struct {
		dir, tr string
		v       uint64
	}{
		{"from_client", transportUDP, st.Received - st.ReceivedTCP}, {"from_client", transportTCP, st.ReceivedTCP},
		{"to_client", transportUDP, st.Sent - min(st.Sent, st.SentTCP)}, {"to_client", transportTCP, st.SentTCP},
	} {
		ch <- prometheus.MustNewConstMetric(c.datagrams, prometheus.CounterValue, float64(d.v), d.dir, d.tr)
	}
}
