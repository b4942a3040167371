package transceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/peer"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// metrics are the transceiver's Prometheus metrics, all created at start-up.
type metrics struct {
	sessionsStarted prometheus.Counter
	sessionsFailed  prometheus.Counter
	sessionsEnded   *prometheus.CounterVec
	eventsDropped   prometheus.Counter
	signaling       prometheus.Histogram
	connect         prometheus.Histogram
	// setup is the time from the offer to each setup phase.
	setup *prometheus.HistogramVec
	// setupPhase is each setup phase's time from the end of the previous
	// one (setup.go).
	setupPhase *prometheus.HistogramVec
	// setupFailures counts sessions that failed a setup phase, by reason.
	setupFailures *prometheus.CounterVec
	// dtlsHandshakes counts completed DTLS handshakes by the version
	// negotiated and whether they ran in the ICE checks (SPED).
	dtlsHandshakes *prometheus.CounterVec
	// Call quality from the client's RTCP receiver reports (RFC 3550 §6.4.1)
	// about the audio the transceiver sends.
	rtt, jitter prometheus.Histogram
	loss        prometheus.Histogram
	// The same once per session, at its end (reports.go).
	sessionRTT, sessionJitter, sessionLoss prometheus.Histogram
	// Turn-taking (turns.go): speech end → the reply, by stage; speech
	// over a reply → the edge quiet.
	turnReply         *prometheus.HistogramVec
	interruptionQuiet prometheus.Histogram
	// Backend bridge.
	bridgeDial   prometheus.Histogram
	bridgeErrors *prometheus.CounterVec
	// mediaDelay is the time an audio packet spends inside the
	// transceiver, by direction (delay.go).
	mediaDelay *prometheus.HistogramVec
	// iceRestarts counts PATCH ICE restarts by result: ok, failed.
	iceRestarts *prometheus.CounterVec
	// Media path (media.go).
	backendRefused     *prometheus.CounterVec // by reason: bad backend input
	clears             *prometheus.CounterVec // by source: backend, client, turn
	turns              *prometheus.CounterVec // turn detection events, by event: speech_started, speech_stopped, speech_paused, speech_resumed, timeout_triggered
	interruptions      *prometheus.CounterVec // speech over a reply, by result: cleared, resumed
	heldReplies        *prometheus.CounterVec // replies held for a tentative turn, by result: played, discarded
	clientAudioDropped *prometheus.CounterVec // by reason: invalid_rtp, invalid_opus, late
	concealed          *prometheus.CounterVec // seconds, by method: fec, plc
	// echoRefDropped counts packets sent to clients that input cleaning's
	// far-end reference left out, by reason: ring_full, undecodable
	// (clean.go).
	echoRefDropped *prometheus.CounterVec
	// clientConnection counts clients going silent and coming back (consent.go).
	clientConnection *prometheus.CounterVec
	// offersRefused counts offers refused before any work, by reason (pending.go).
	offersRefused *prometheus.CounterVec
	outputDropped prometheus.Counter // paced packets the client's track refused
	tracksIgnored prometheus.Counter // client audio tracks after the first
	dcRefused     prometheus.Counter // data channels beyond maxDataChannels
	// rtcpDropped counts client RTCP packets dropped, by reason: malformed (reports.go).
	rtcpDropped *prometheus.CounterVec
	// peerDropped counts datagrams the peer endpoint's read loop dropped,
	// by reason (peer.DropReason); peerDrops holds its counters by reason.
	peerDropped *prometheus.CounterVec
	peerDrops   [peer.NumDropReasons]prometheus.Counter
}

// peerDrop counts one datagram the peer endpoint dropped (its
// Config.OnDrop, on its read loop).
func (m *metrics) peerDrop(r peer.DropReason) {
	if r > 0 && r < peer.NumDropReasons {
		m.peerDrops[r].Inc()
	}
}

// Setup phases, the values of the phase label.
const (
	phaseICE        = "ice"         // ICE connected (the client's nomination reached us)
	phaseDTLS       = "dtls"        // DTLS handshake done
	phaseFirstAudio = "first_audio" // first client audio packet handed to the backend
)

// replyBuckets span the speech end → reply latencies of voice agents, in
// seconds: the silence window (0.5 s by default) and a pipeline's
// hundreds of milliseconds.
var replyBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.2, 1.5, 2, 3, 5, 10}

// Stages of switchboard_transceiver_turn_reply_seconds.
const (
	stageBackend = "backend" // the first reply audio from the backend
	stageClient  = "client"  // the reply's first packet sent to the client
)

// setupBuckets span 1 ms to ~4 s, in seconds.
var setupBuckets = prometheus.ExponentialBuckets(0.001, 2, 13)

// setupPhaseBuckets span 1 ms to ~16 s: a phase under loss waits for
// retransmissions.
var setupPhaseBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

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
		setup: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_setup_seconds", Help: "Time from offer received to each setup phase: ice, dtls, first_audio (at the backend).", Buckets: setupBuckets,
		}, []string{"phase"}),
		setupPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_setup_phase_seconds", Help: "Time of each setup phase from the end of the previous one: check (answer sent to the first authenticated check), dtls (to the DTLS handshake done), first_audio (to the first client audio at the backend).", Buckets: setupPhaseBuckets,
		}, []string{"phase"}),
		setupFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_setup_failures_total", Help: "Sessions whose setup failed, by where it stopped: ice no_check (no authenticated check), ice failed (checks stopped), dtls no_dtls (checks, no DTLS from the client), dtls timeout (handshake incomplete), dtls failed, sctp timeout (connected, data channels' SCTP not up; the session goes on).",
		}, []string{"phase", "reason"}),
		dtlsHandshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_dtls_handshakes_total", Help: "Completed DTLS handshakes, by the version negotiated (1.2, 1.3) and whether the handshake ran inside the ICE checks (in_stun: SPED, a=ice-options sped or googspedv1).",
		}, []string{"version", "in_stun"}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_rtt_seconds", Help: "Round-trip time to clients, from RTCP receiver reports (LSR/DLSR, RFC 3550 6.4.1).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 12),
		}),
		jitter: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_jitter_seconds", Help: "Interarrival jitter clients report for the audio they receive, from RTCP receiver reports.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 10),
		}),
		loss: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_loss_ratio", Help: "Fraction of audio packets lost towards clients, per RTCP receiver report.",
			Buckets: []float64{0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
		}),
		sessionRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_session_rtt_seconds", Help: "Each session's mean round-trip time to its client over its RTCP receiver reports, observed once when it ends (sessions with one).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 12),
		}),
		sessionJitter: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_session_jitter_seconds", Help: "Each session's mean interarrival jitter its client reported for the audio it received, observed once when it ends.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 10),
		}),
		sessionLoss: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_session_loss_ratio", Help: "Each session's fraction of audio packets lost towards its client (the last receiver report's cumulative loss over the packets sent up to it), observed once when it ends.",
			Buckets: []float64{0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
		}),
		turnReply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchboard_transceiver_turn_reply_seconds",
			Help:    "From the end of the user's speech (a turn's speech end, which the silence window follows) to its reply, by stage: backend (the first reply audio from the backend: its latency plus the silence window, less what a tentative turn saved), client (the reply's first packet sent to the client).",
			Buckets: replyBuckets,
		}, []string{"stage"}),
		interruptionQuiet: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_interruption_quiet_seconds", Help: "From the onset of speech over the agent's reply (as the detector placed it) to the edge's clear or pause of the reply: the next tick sends nothing (turn detection's share of barge-in).",
			Buckets: []float64{0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1},
		}),
		bridgeDial: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_bridge_dial_seconds", Help: "Time to open a session's backend bridge (WebSocket, hello, session.start).", Buckets: setupBuckets,
		}),
		bridgeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_bridge_errors_total", Help: "Backend bridge failures, by operation: dial, send, recv.",
		}, []string{"op"}),
		mediaDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "switchboard_transceiver_media_delay_seconds",
			Help: "Time a sampled audio packet spends inside the transceiver, by direction: to_backend (hop socket read to bridge write), to_client (paced send on the playout tick to hop socket write; the wait in the playout queue is not counted).", Buckets: delayBuckets,
		}, []string{"direction"}),
		iceRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_ice_restarts_total", Help: "ICE restarts requested with PATCH (RFC 9725 4.3), by result: ok, failed.",
		}, []string{"result"}),
		backendRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_backend_input_refused_total", Help: "Backend input refused or ignored, by reason (docs/bridge.md 8.1): pcm_odd_length, invalid_opus, output_queue_full, invalid_mark_name, invalid_response_id, unexpected_type, unknown_type, clear_idle, invalid_turn_detection.",
		}, []string{"reason"}),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_output_clears_total", Help: "Output queue clears, by source: backend (output.clear), client (output_audio_buffer.clear), turn (barge-in: turn detection heard the user start talking).",
		}, []string{"source"}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_turn_events_total", Help: "Turn detection events (docs/bridge.md 4.8), by event: speech_started, speech_stopped, speech_paused (the early pause, whether or not it was sent as a tentative turn), speech_resumed, timeout_triggered (idle timeout).",
		}, []string{"event"}),
		interruptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_interruptions_total", Help: "Speech that started over the agent's reply with interrupt_response on, by result: cleared (the reply was cut: at once, or once that speech proved a turn with resume_false_interruption), resumed (the reply, paused, resumed: a cough or a backchannel).",
		}, []string{"result"}),
		heldReplies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_held_replies_total", Help: "Backend audio held for a tentative end of turn (input.speech_paused), by result: played (the turn was confirmed: it played at once), discarded (the user went on talking).",
		}, []string{"result"}),
		clientAudioDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_client_audio_dropped_total", Help: "Client audio packets dropped, by reason: invalid_rtp (an RTP packet that does not parse after SRTP, e.g. a bad padding length; any format), and for a PCM backend invalid_opus, late (reordered or duplicated).",
		}, []string{"reason"}),
		outputDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_output_packets_dropped_total", Help: "Paced audio packets that could not be sent to the client (not connected, or a socket write error).",
		}),
		rtcpDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_rtcp_dropped_total",
			Help: "Client compound RTCP packets dropped after SRTCP decryption, by reason: malformed (does not parse, RFC 3550 6.1).",
		}, []string{"reason"}),
		peerDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_peer_dropped_total",
			Help: "Client datagrams the WebRTC read loop dropped, by reason: unknown_packet (not STUN, DTLS or RTP, RFC 7983), stun_malformed, stun_not_request (a response), stun_indication (a keepalive some clients send), stun_unknown_ufrag (no such session, or an ICE restart's old ufrag), stun_bad_username, stun_bad_integrity, stun_bad_fingerprint, unknown_address (DTLS or SRTP from an address no authenticated check came from), dtls_queue_full, srtp_not_ready, srtp_auth (SRTP or SRTCP that does not authenticate, or a replay), rtp_queue_full (the session's media reader is behind), sped_malformed (a check's DTLS-IN-STUN that is not DTLS, or a bad DTLS-IN-STUN-ACK).",
		}, []string{"reason"}),
		dcRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_data_channels_refused_total", Help: "Data channels a client opened beyond the per-session limit (4), closed at once.",
		}),
		tracksIgnored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_transceiver_client_tracks_ignored_total", Help: "Client audio tracks ignored because the session already has one (offers with several audio sections).",
		}),
		concealed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_client_audio_concealed_seconds_total", Help: "Client audio lost and concealed for PCM backends, by method: fec (Opus in-band FEC from the next packet), plc.",
		}, []string{"method"}),
		echoRefDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_echo_reference_dropped_total", Help: "Audio packets sent to clients that echo cancellation's far-end reference left out (the canceller hears silence there), by reason: ring_full (the client sent no audio for over a second of the agent's: the 100 packets waiting for the track goroutine overflowed), undecodable (the packet did not decode).",
		}, []string{"reason"}),
		clientConnection: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_transceiver_client_connection_total",
			Help: "Connected clients that went silent for the disconnected timeout (state=disconnected) and that came back (state=connected); each is told to the backend.",
		}, []string{"state"}),
	}
	m.offersRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchboard_transceiver_offers_refused_total",
		Help: "Offers refused before any work, by reason: pending_per_client (429), pending_total, capacity, draining (503).",
	}, []string{"reason"})
	for _, r := range []string{refusedPendingClient, refusedPendingTotal, refusedCapacity, refusedDraining} {
		m.offersRefused.WithLabelValues(r)
	}
	for _, st := range []string{"disconnected", "connected"} {
		m.clientConnection.WithLabelValues(st)
	}
	for _, r := range []string{"ok", "failed"} {
		m.iceRestarts.WithLabelValues(r)
	}
	for _, r := range refusedReasons {
		m.backendRefused.WithLabelValues(r)
	}
	for _, src := range []string{"backend", "client", clearSourceTurn} {
		m.clears.WithLabelValues(src)
	}
	for _, e := range []string{"speech_started", "speech_stopped", "speech_paused", "speech_resumed", turnTimeout} {
		m.turns.WithLabelValues(e)
	}
	for _, r := range []string{interruptionCleared, interruptionResumed} {
		m.interruptions.WithLabelValues(r)
	}
	for _, r := range []string{heldPlayed, heldDiscarded} {
		m.heldReplies.WithLabelValues(r)
	}
	for _, st := range []string{stageBackend, stageClient} {
		m.turnReply.WithLabelValues(st)
	}
	for _, r := range []string{"invalid_rtp", "invalid_opus", "late"} {
		m.clientAudioDropped.WithLabelValues(r)
	}
	for _, r := range []string{"fec", "plc"} {
		m.concealed.WithLabelValues(r)
	}
	for _, r := range []string{echoRefRingFull, echoRefUndecodable} {
		m.echoRefDropped.WithLabelValues(r)
	}
	for _, d := range []string{dirToBackend, dirToClient} {
		m.mediaDelay.WithLabelValues(d)
	}
	for _, ph := range []string{phaseICE, phaseDTLS, phaseFirstAudio} {
		m.setup.WithLabelValues(ph)
	}
	for _, f := range setupFailureLabels {
		m.setupFailures.WithLabelValues(f[0], f[1])
	}
	for _, ph := range []string{phaseCheck, phaseDTLS, phaseFirstAudio} {
		m.setupPhase.WithLabelValues(ph)
	}
	for _, v := range []peer.DTLSVersion{peer.DTLS12, peer.DTLS13} {
		for _, in := range []string{"false", "true"} {
			m.dtlsHandshakes.WithLabelValues(v.String(), in)
		}
	}
	for _, op := range []string{"dial", "send", "recv"} {
		m.bridgeErrors.WithLabelValues(op)
	}
	m.rtcpDropped.WithLabelValues(rtcpMalformed)
	for r := peer.DropReason(1); r < peer.NumDropReasons; r++ {
		m.peerDrops[r] = m.peerDropped.WithLabelValues(r.String())
	}
	if reg == nil {
		return m
	}
	active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchboard_transceiver_sessions", Help: "Live sessions.",
	}, func() float64 { return float64(s.Sessions()) })
	lateTicks := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_playout_late_ticks_total", Help: "Playout clock slots (a quarter of the packet time) with sessions on them that a worker played late, together with a later one, because it was busy or not scheduled in time (their packets leave back to back).",
	}, func() float64 { return float64(s.clock.Stats().LateTicks) })
	caughtUp := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_playout_caught_up_seconds_total", Help: "Audio the playout clock sent ahead of its timeline to shed the backlog of backends streaming at about real time (docs/bridge.md 6.1).",
	}, func() float64 { return float64(s.clock.Stats().CaughtUp) / 48000 })
	pionSuppressed := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_pion_log_suppressed_total", Help: "Pion log lines dropped over the per-scope limit (20 at once, then 5 a second).",
	}, func() float64 { return float64(s.pion.Suppressed()) })
	const spedHelp = "DTLS datagrams carried in the ICE checks (SPED), by direction: from_client (taken from clients' checks into the handshake), to_client (sent inside Binding responses)."
	spedIn := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_sped_datagrams_total", Help: spedHelp, ConstLabels: prometheus.Labels{"direction": "from_client"},
	}, func() float64 { return float64(s.PeerSPED().In) })
	spedOut := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_sped_datagrams_total", Help: spedHelp, ConstLabels: prometheus.Labels{"direction": "to_client"},
	}, func() float64 { return float64(s.PeerSPED().Out) })
	socketDropped := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_transceiver_socket_dropped_total", Help: "Datagrams the kernel dropped at the transceiver's UDP socket (internal hop, or clients with -direct) because its receive buffer was full: they never reached the transceiver (Linux SO_MEMINFO; 0 elsewhere).",
	}, func() float64 {
		// A closed socket (after Close) has no count: keep the last one.
		if d, err := udpio.Drops(s.sock); err == nil {
			s.sockDrops.Store(d)
		}
		return float64(s.sockDrops.Load())
	})
	reg.MustRegister(m.sessionsStarted, m.sessionsFailed, m.sessionsEnded, m.eventsDropped, m.signaling, m.connect,
		m.setup, m.setupPhase, m.setupFailures, m.dtlsHandshakes, m.rtt, m.jitter, m.loss, m.sessionRTT, m.sessionJitter, m.sessionLoss, m.turnReply, m.interruptionQuiet, m.bridgeDial, m.bridgeErrors, m.iceRestarts, m.mediaDelay, m.clientConnection, m.offersRefused,
		m.backendRefused, m.clears, m.turns, m.interruptions, m.heldReplies, m.clientAudioDropped, m.concealed, m.echoRefDropped, m.outputDropped, m.tracksIgnored, m.dcRefused, m.rtcpDropped, m.peerDropped, lateTicks, caughtUp, active, newHopCollector(s.HopStats), newPeerMovesCollector(s.PeerMoves), pionSuppressed, socketDropped, spedIn, spedOut)
	return m
}
