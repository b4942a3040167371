package relay

import "github.com/prometheus/client_golang/prometheus"

// collector exports the relay's atomic counters to Prometheus at scrape
// time; the packet path never calls into Prometheus.
type collector struct {
	r                            *Relay
	drops, packets, bytes, flows *prometheus.Desc
	socketDrops                  *prometheus.Desc
	created, expired, relearned  *prometheus.Desc
	restored                     *prometheus.Desc
	held, heldTotal              *prometheus.Desc
	// Flow cache (nil without one).
	cacheUp, cacheHeld, cacheLookups, cacheWrites *prometheus.Desc
	// ICE-TCP (nil without it).
	tcpConns, tcpAccepted, tcpClosed, tcpFrames, tcpBytes *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(r *Relay) *collector {
	c := &collector{
		r: r,
		drops: prometheus.NewDesc("switchboard_relay_drops_total",
			"Datagrams the relay dropped, by reason (docs/relay.md).", []string{"reason"}, nil),
		socketDrops: prometheus.NewDesc("switchboard_relay_socket_dropped_total",
			"Datagrams the kernel dropped at the relay's sockets (public, internal; all workers) because their receive buffers were full: the relay never read them (Linux SO_MEMINFO; 0 elsewhere).", []string{"socket"}, nil),
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
		held: prometheus.NewDesc("switchboard_relay_held_requests",
			"First Binding requests (valid token) a per-source cap delayed, held now for a retry (UDP: the waiting room; TCP: on their connection).", nil, nil),
		heldTotal: prometheus.NewDesc("switchboard_relay_held_requests_total",
			"First Binding requests a per-source cap delayed, by result: held (a client's retransmission replacing its held request counts again), admitted (forwarded once the cap let it through), expired (dropped after 2 s, counted under its cap's drop reason too), full (not held, no room: dropped under its cap's reason).", []string{"result"}, nil),
	}
	if r.fc != nil {
		c.restored = prometheus.NewDesc("switchboard_relay_flows_restored_total",
			"Flows recreated from the flow cache for a client whose DTLS/RTP/RTCP missed the flow table.", nil, nil)
		c.cacheUp = prometheus.NewDesc("switchboard_relay_flow_cache_up",
			"1 if the last call to the flow cache worked (or none failed yet), 0 while it is unreachable and backed off.", nil, nil)
		c.cacheHeld = prometheus.NewDesc("switchboard_relay_flow_cache_held_total",
			"Datagrams from clients without a flow held while the flow cache was asked; each is then forwarded (packets_total) or dropped under a flow_cache_* or cap reason.", nil, nil)
		c.cacheLookups = prometheus.NewDesc("switchboard_relay_flow_cache_lookups_total",
			"Clients looked up in the flow cache, by result (hit: restored, or the client had a flow meanwhile; miss; stale: undecodable, not a member or another way; error; refused: restore refused by a cap).", []string{"result"}, nil)
		c.cacheWrites = prometheus.NewDesc("switchboard_relay_flow_cache_writes_total",
			"Confirmed flows written to the flow cache, by result (ok, error, skipped: cache backing off or write queue full; the next refresh pass writes them).", []string{"result"}, nil)
	}
	if r.cfg.TCPAddr != "" {
		c.tcpConns = prometheus.NewDesc("switchboard_relay_tcp_connections",
			"Open ICE-TCP client connections, by state (awaiting_first_frame, established: the first frame, a Binding request with a valid token, was admitted).", []string{"state"}, nil)
		c.tcpAccepted = prometheus.NewDesc("switchboard_relay_tcp_accepted_total",
			"ICE-TCP connections accepted, refused ones included.", nil, nil)
		c.tcpClosed = prometheus.NewDesc("switchboard_relay_tcp_closed_total",
			"ICE-TCP connections closed or refused, by reason (docs/relay.md, \"ICE-TCP\").", []string{"reason"}, nil)
		c.tcpFrames = prometheus.NewDesc("switchboard_relay_tcp_frames_total",
			"RFC 4571 frames forwarded for ICE-TCP clients, by direction (to_transceiver, to_client: written to the connection).", []string{"direction"}, nil)
		c.tcpBytes = prometheus.NewDesc("switchboard_relay_tcp_bytes_total",
			"Packet bytes of the frames forwarded for ICE-TCP clients (framing and hop header excluded), by direction.", []string{"direction"}, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.drops, c.socketDrops, c.packets, c.bytes, c.flows, c.created, c.expired, c.relearned, c.held, c.heldTotal} {
		ch <- d
	}
	if c.r.fc != nil {
		for _, d := range []*prometheus.Desc{c.restored, c.cacheUp, c.cacheHeld, c.cacheLookups, c.cacheWrites} {
			ch <- d
		}
		c.r.fc.batches.Describe(ch)
	}
	if c.tcpConns != nil {
		for _, d := range []*prometheus.Desc{c.tcpConns, c.tcpAccepted, c.tcpClosed, c.tcpFrames, c.tcpBytes} {
			ch <- d
		}
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.r.Stats()
	for reason := DropReason(1); reason < NumDropReasons; reason++ {
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(s.Drops[reason]), reason.String())
	}
	ch <- prometheus.MustNewConstMetric(c.socketDrops, prometheus.CounterValue, float64(s.PublicSocketDrops), "public")
	ch <- prometheus.MustNewConstMetric(c.socketDrops, prometheus.CounterValue, float64(s.InternalSocketDrops), "internal")
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
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Waiting))
	for i, v := range [numWaitResults]uint64{s.Held, s.Admitted, s.Expired, s.NotHeld} {
		ch <- prometheus.MustNewConstMetric(c.heldTotal, prometheus.CounterValue, float64(v), waitResultNames[i])
	}
	if c.tcpConns != nil {
		t := s.TCP
		ch <- prometheus.MustNewConstMetric(c.tcpConns, prometheus.GaugeValue, float64(t.Open-t.Established), "awaiting_first_frame")
		ch <- prometheus.MustNewConstMetric(c.tcpConns, prometheus.GaugeValue, float64(t.Established), "established")
		ch <- prometheus.MustNewConstMetric(c.tcpAccepted, prometheus.CounterValue, float64(t.Accepted))
		for reason := range NumTCPCloseReasons {
			ch <- prometheus.MustNewConstMetric(c.tcpClosed, prometheus.CounterValue, float64(t.Closed[reason]), reason.String())
		}
		ch <- prometheus.MustNewConstMetric(c.tcpFrames, prometheus.CounterValue, float64(t.ToTransceiverFrames), directionNames[toTransceiver])
		ch <- prometheus.MustNewConstMetric(c.tcpFrames, prometheus.CounterValue, float64(t.ToClientFrames), directionNames[toClient])
		ch <- prometheus.MustNewConstMetric(c.tcpBytes, prometheus.CounterValue, float64(t.ToTransceiverBytes), directionNames[toTransceiver])
		ch <- prometheus.MustNewConstMetric(c.tcpBytes, prometheus.CounterValue, float64(t.ToClientBytes), directionNames[toClient])
	}
	if c.r.fc == nil {
		return
	}
	fs := s.FlowCache
	up := 0.0
	if fs.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.restored, prometheus.CounterValue, float64(s.FlowsRestored))
	ch <- prometheus.MustNewConstMetric(c.cacheUp, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.cacheHeld, prometheus.CounterValue, float64(fs.Held))
	for i, v := range [numLookupResults]uint64{fs.Hits, fs.Misses, fs.Stale, fs.Errors, fs.Refused} {
		ch <- prometheus.MustNewConstMetric(c.cacheLookups, prometheus.CounterValue, float64(v), lookupNames[i])
	}
	for i, v := range [numWriteResults]uint64{fs.WritesOK, fs.WritesFailed, fs.WritesSkipped} {
		ch <- prometheus.MustNewConstMetric(c.cacheWrites, prometheus.CounterValue, float64(v), writeNames[i])
	}
	c.r.fc.batches.Collect(ch)
}
