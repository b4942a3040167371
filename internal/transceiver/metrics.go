package transceiver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the transceiver's Prometheus metrics, all created at start-up.
type metrics struct {
	sessionsStarted prometheus.Counter
	sessionsFailed  prometheus.Counter
	sessionsEnded   *prometheus.CounterVec
	eventsDropped   prometheus.Counter
	signaling       prometheus.Histogram
	connect         prometheus.Histogram
}

// setupBuckets span 1 ms to ~4 s, in seconds.
var setupBuckets = prometheus.ExponentialBuckets(0.001, 2, 13)

func newMetrics(s *Server, reg prometheus.Registerer) *metrics {
	m := &metrics{
		sessionsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_sessions_started_total", Help: "Sessions whose offer was answered.",
		}),
		sessionsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_sessions_failed_total", Help: "Offers that did not become a session (bad offer, backend down, capacity).",
		}),
		sessionsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_sessions_ended_total", Help: "Sessions ended, by reason.",
		}, []string{"reason"}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_events_dropped_total", Help: "Backend events not delivered because the client's data channel was not open.",
		}),
		signaling: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_signaling_seconds", Help: "Time from offer received to answer ready.", Buckets: setupBuckets,
		}),
		connect: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_connect_seconds", Help: "Time from offer received to ICE and DTLS connected.", Buckets: setupBuckets,
		}),
	}
	if reg == nil {
		return m
	}
	active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchboard_transceiver_sessions", Help: "Live sessions.",
	}, func() float64 { return float64(s.Sessions()) })
	hopDropped := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_hop_dropped_total", Help: "Datagrams on the internal-hop socket that were not valid hop datagrams from an allowed relay.",
	}, func() float64 { st := s.HopStats(); return float64(st.DroppedNotHop + st.DroppedUntrusted) })
	reg.MustRegister(m.sessionsStarted, m.sessionsFailed, m.sessionsEnded, m.eventsDropped, m.signaling, m.connect, active, hopDropped)
	return m
}
