package transceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/hop"
)

// hopCollector exports the internal-hop socket's counters (hop.ConnStats),
// read at scrape time, every series present from the first scrape:
//
//	switchboard_transceiver_hop_dropped_total{reason}  not_hop, untrusted, too_big, send_failed
//	switchboard_transceiver_hop_moves_total{reason}    nominated, quiet (hop/latch.go)
type hopCollector struct {
	stats          func() hop.ConnStats
	dropped, moves *prometheus.Desc
}

func newHopCollector(stats func() hop.ConnStats) *hopCollector {
	return &hopCollector{
		stats: stats,
		dropped: prometheus.NewDesc("switchboard_transceiver_hop_dropped_total",
			"Datagrams on the internal-hop socket dropped, by reason: not_hop (no valid hop header), untrusted (from outside the allowed relay prefixes), too_big (a client datagram longer than hop.MaxPayload, either way), send_failed (a paced RTP packet of a batched send the kernel refused).",
			[]string{"reason"}, nil),
		moves: prometheus.NewDesc("switchboard_transceiver_hop_moves_total",
			"Moves of a session's media to another address of its client (NAT rebinding), by reason: nominated (an authenticated check with USE-CANDIDATE), quiet (an authenticated check after the current address sent nothing for the latch's quiet time).",
			[]string{"reason"}, nil),
	}
}

func (c *hopCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.dropped
	ch <- c.moves
}

func (c *hopCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, d := range []struct {
		reason string
		n      uint64
	}{{"not_hop", st.DroppedNotHop}, {"untrusted", st.DroppedUntrusted}, {"too_big", st.DroppedTooBig}, {"send_failed", st.DroppedSendFailed}} {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(d.n), d.reason)
	}
	for r := range hop.NumMoveReasons {
		ch <- prometheus.MustNewConstMetric(c.moves, prometheus.CounterValue, float64(st.Moves[r]), r.String())
	}
}
