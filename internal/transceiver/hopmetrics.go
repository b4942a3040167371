package transceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
	"github.com/switchboard-rtc/switchboard/internal/peer"
)

// hopCollector exports the internal-hop socket's counters (hop.ConnStats),
// read at scrape time, every series present from the first scrape:
//
//	switchboard_transceiver_hop_dropped_total{reason}  not_hop, untrusted, too_big, send_failed
//
// A client's moves to another address (NAT rebinding) are the endpoint's,
// switchboard_transceiver_peer_moves_total (peerMovesCollector).
type hopCollector struct {
	stats   func() hop.ConnStats
	dropped *prometheus.Desc
}

func newHopCollector(stats func() hop.ConnStats) *hopCollector {
	return &hopCollector{
		stats: stats,
		dropped: prometheus.NewDesc("switchboard_transceiver_hop_dropped_total",
			"Datagrams on the internal-hop socket dropped, by reason: not_hop (no valid hop header), untrusted (from outside the allowed relay prefixes), too_big (a client datagram longer than hop.MaxPayload, either way), send_failed (a paced RTP packet of a batched send the kernel refused).",
			[]string{"reason"}, nil),
	}
}

func (c *hopCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.dropped
}

func (c *hopCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, d := range []struct {
		reason string
		n      uint64
	}{{"not_hop", st.DroppedNotHop}, {"untrusted", st.DroppedUntrusted}, {"too_big", st.DroppedTooBig}, {"send_failed", st.DroppedSendFailed}} {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(d.n), d.reason)
	}
}

// peerMovesCollector exports the WebRTC endpoint's moves of sessions' media
// (peer.Endpoint.Moves), read at scrape time, every series present from
// the first scrape:
//
//	switchboard_transceiver_peer_moves_total{reason}  nominated, confirmed, deferred (peer/session.go, "Path selection")
type peerMovesCollector struct {
	moves func() [peer.NumMoveReasons]uint64
	desc  *prometheus.Desc
}

func newPeerMovesCollector(moves func() [peer.NumMoveReasons]uint64) *peerMovesCollector {
	return &peerMovesCollector{
		moves: moves,
		desc: prometheus.NewDesc("switchboard_transceiver_peer_moves_total",
			"Moves of a session's media to another client address by the WebRTC endpoint, by reason: nominated (a nominating check, before the client's media began), confirmed (the client's SRTP or SRTCP from an address a fresh check came from, after); and deferred: nominating checks from another address after the client's media began that moved nothing, waiting for the client's media from there (a NAT rebinding's first check, or a replayed check: a deferred count far above confirmed is checks that media never followed).",
			[]string{"reason"}, nil),
	}
}

func (c *peerMovesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *peerMovesCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.moves()
	for r := range peer.NumMoveReasons {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(m[r]), r.String())
	}
}
