package relay

import "github.com/prometheus/client_golang/prometheus"

// collector exports the relay's atomic counters to Prometheus at scrape
// time; the packet path never calls into Prometheus.
type collector struct {
	r                            *Relay
	drops, packets, bytes, flows *prometheus.Desc
	created, expired, relearned  *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(r *Relay) *collector {
	return &collector{
		r: r,
		drops: prometheus.NewDesc("switchboard_relay_drops_total",
			"Datagrams the relay dropped, by reason (docs/relay.md).", []string{"reason"}, nil),
		packets: prometheus.NewDesc("switchboard_relay_packets_total",
			"Datagrams the relay forwarded, by direction (to_transceiver, to_client).", []string{"direction"}, nil),
		bytes: prometheus.NewDesc("switchboard_relay_bytes_total",
			"Payload bytes the relay forwarded, internal-hop header excluded, by direction.", []string{"direction"}, nil),
		flows: prometheus.NewDesc("switchboard_relay_flows",
			"Flows in the flow table, by state (pending: no answer from the transceiver yet; confirmed).", []string{"state"}, nil),
		created: prometheus.NewDesc("switchboard_relay_flows_created_total",
			"Flows created or re-pointed (ICE restart) by a Binding request with a valid token.", nil, nil),
		expired: prometheus.NewDesc("switchboard_relay_flows_expired_total",
			"Flows removed by the sweeper, by the state they were in.", []string{"state"}, nil),
		relearned: prometheus.NewDesc("switchboard_relay_flows_relearned_total",
			"Flows rebuilt from a transceiver's traffic for a client the relay did not know (after a restart).", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.drops, c.packets, c.bytes, c.flows, c.created, c.expired, c.relearned} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	for reason := DropReason(1); reason < NumDropReasons; reason++ {
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(s.Drops[reason]), reason.String())
	}
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.ToTransceiverPackets), directionNames[toTransceiver])
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.ToClientPackets), directionNames[toClient])
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.ToTransceiverBytes), directionNames[toTransceiver])
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.ToClientBytes), directionNames[toClient])
	ch <- prometheus.MustNewConstMetric(c.flows, prometheus.GaugeValue, float64(s.PendingFlows), "pending")
	ch <- prometheus.MustNewConstMetric(c.flows, prometheus.GaugeValue, float64(s.Flows-s.PendingFlows), "confirmed")
	ch <- prometheus.MustNewConstMetric(c.created, prometheus.CounterValue, float64(s.FlowsCreated))
	ch <- prometheus.MustNewConstMetric(c.relearned, prometheus.CounterValue, float64(s.FlowsRelearned))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(s.FlowsExpiredPending), "pending")
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(s.FlowsExpiredConfirmed), "confirmed")
}
