package transceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// newBridgePool returns the pool every session's bridge is dialed
// through (docs/bridge.md §12): sessions share v2 connections, up to
// bridge.DefaultSessionsPerConn each, when the backend selects
// switchboard.bridge.v2, and each gets its own v1 WebSocket otherwise.
// The pool's counters are exported through reg (nil for none):
//
//	switchboard_transceiver_bridge_v2_dropped_total{reason}  records from the backend dropped (bridge.DropReason)
//	switchboard_transceiver_bridge_v2_batches_total          WebSocket messages written to the backend
//	switchboard_transceiver_bridge_v2_records_total          records (frames, events, …, session close records) in those messages
//	switchboard_transceiver_bridge_timeouts_total{kind}      backend connections (v1 or v2) failed: "write" (the backend stopped reading), "pong" (no pong to a keepalive ping)
func newBridgePool(url string, reg prometheus.Registerer) *bridge.Pool {
	p := bridge.NewPool(url, bridge.PoolOptions{})
	if reg == nil {
		return p
	}
	st := p.Stats()
	for _, r := range bridge.DropReasons() {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchboard_transceiver_bridge_v2_dropped_total",
			Help:        "Bridge v2 records from the backend dropped, by reason (docs/bridge.md §12).",
			ConstLabels: prometheus.Labels{"reason": r.String()},
		}, func() float64 { return float64(st.Drops(r)) }))
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "switchboard_transceiver_bridge_v2_batches_total",
			Help: "Bridge v2 WebSocket messages (batches of records) written to the backend.",
		}, func() float64 { return float64(st.Batches()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "switchboard_transceiver_bridge_v2_records_total",
			Help: "Bridge v2 records (audio frames, events, control, session.end, close records) written to the backend.",
		}, func() float64 { return float64(st.Records()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchboard_transceiver_bridge_timeouts_total",
			Help:        "Backend bridge connections (v1 or v2) failed by a timeout: write (a write not done within the write timeout), pong (no pong to a keepalive ping) (docs/bridge.md §8, §12.5).",
			ConstLabels: prometheus.Labels{"kind": "write"},
		}, func() float64 { return float64(st.WriteTimeouts()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "switchboard_transceiver_bridge_timeouts_total",
			Help:        "Backend bridge connections (v1 or v2) failed by a timeout: write (a write not done within the write timeout), pong (no pong to a keepalive ping) (docs/bridge.md §8, §12.5).",
			ConstLabels: prometheus.Labels{"kind": "pong"},
		}, func() float64 { return float64(st.PongTimeouts()) }),
	)
	return p
}
