package relay

// DropReason says why the relay dropped a datagram. Every reason has a
// counter, created when the relay starts, exported as
// switchboard_relay_drops_total{reason="<String()>"}. docs/relay.md explains
// each one.
type DropReason uint8

// dropNone is the zero value: the datagram is forwarded.
const dropNone DropReason = 0

const (
	// Public socket, before any flow lookup.

	// DropUnknownFirstByte: the first byte is in no RFC 7983 range the relay
	// forwards (STUN, DTLS, RTP/RTCP), or the datagram is empty.
	DropUnknownFirstByte DropReason = iota + 1
	// DropNotSTUNOnMiss: DTLS, RTP or RTCP from a client without a flow.
	DropNotSTUNOnMiss
	// DropSTUNMalformed: first byte says STUN, the header or attributes do not parse.
	DropSTUNMalformed
	// DropSTUNNotBindingRequest: well-formed STUN other than a Binding request, without a flow.
	DropSTUNNotBindingRequest
	// DropNoUsername: a Binding request without USERNAME, without a flow.
	DropNoUsername
	// DropUsernameMalformed: USERNAME too long, without a colon, or with a
	// server ufrag outside 4-256 bytes.
	DropUsernameMalformed
	// DropTokenMalformed: the server ufrag is not a routing token (length,
	// alphabet, version).
	DropTokenMalformed
	// DropTokenForged: the token's tag does not verify.
	DropTokenForged
	// DropTokenUnknownKey: the token is sealed with a key id the keyring lacks.
	DropTokenUnknownKey
	// DropTokenExpired: the token is older than the keyring's MaxAge.
	DropTokenExpired
	// DropWrongCluster: the token belongs to another cluster.
	DropWrongCluster
	// DropUnknownTransceiver: the token's transceiver id is not in the membership table.
	DropUnknownTransceiver
	// DropFlowTableFull: a valid first packet while the table holds MaxFlows flows.
	DropFlowTableFull
	// DropSourceRateLimit: a valid first packet from a source IP (IPv6: /64)
	// that created Config.NewFlowsPerIP flows this second (limits.go).
	DropSourceRateLimit
	// DropSourceRateDelayed: a valid first packet over its source's rate,
	// given a turn (limits.go): the client's retransmission at or after
	// it creates the flow.
	DropSourceRateDelayed
	// DropSourcePendingLimit: a valid first packet from a source IP that
	// holds Config.MaxPendingPerIP pending flows.
	DropSourcePendingLimit
	// DropNewFlowRateLimit: a valid first packet while all sources together
	// created Config.NewFlowsPerSecond flows this second.
	DropNewFlowRateLimit
	// DropTransceiverGone: the flow's transceiver left the membership table;
	// the flow is removed at the next sweep.
	DropTransceiverGone
	// DropUnknownCluster: ingress mode, the token's cluster has no relay in
	// the table.
	DropUnknownCluster
	// DropIngressUntrusted: a hop-framed datagram on the public socket from
	// a source outside Config.TrustedIngress.
	DropIngressUntrusted
	// DropIngressBadHeader: a hop-framed datagram from a trusted ingress
	// whose header does not parse.
	DropIngressBadHeader

	// Flow cache (Config.FlowStore, flowcache.go): DTLS/RTP/RTCP from a
	// client without a flow, which the cache could not recover.

	// DropFlowCacheMiss: the cache has no flow for the client (or had
	// none less than a second ago).
	DropFlowCacheMiss
	// DropFlowCacheDown: the cache is unreachable or backing off after an
	// error; the datagram was not held, or its lookup failed.
	DropFlowCacheDown
	// DropFlowCacheTimeout: the lookup's answer came after the hold time
	// (200 ms), or the client had too little of it left to be looked up.
	DropFlowCacheTimeout
	// DropFlowCacheHoldFull: the client already has its held datagrams
	// (8), its source IP (IPv6: /64) its share of lookups (32) or held
	// datagrams (64), or the relay's held-datagram pool or lookup table is
	// full (a full table bucket gives way only to a new lookup, and only
	// a remembered answer's slot).
	DropFlowCacheHoldFull
	// DropFlowCacheStale: the cache's entry does not decode, names a
	// transceiver that is not a member with that id and address, or its
	// flow came through a Global Relay and the held datagram another way
	// (another one, or direct; or the reverse).
	DropFlowCacheStale

	// Internal socket.

	// DropInternalUnknownPeer: the sender is not in the membership table.
	DropInternalUnknownPeer
	// DropInternalBadHeader: the internal-hop header does not parse.
	DropInternalBadHeader
	// DropInternalEmptyPayload: a header with nothing after it.
	DropInternalEmptyPayload
	// DropInternalNoFlow: the named client has no flow: the relay never sends
	// to a public address it has no flow for.
	DropInternalNoFlow
	// DropInternalFlowMismatch: the named client's flow points to another transceiver.
	DropInternalFlowMismatch

	// Socket errors, counted by the read loops.

	// DropReadError: a read from either socket failed (other than on Close).
	DropReadError
	// DropWriteError: the forwarding write failed.
	DropWriteError
	// DropTooBig: a client payload longer than hop.MaxPayload (1,500
	// bytes), from a client or from a transceiver: the path's one limit.
	DropTooBig

	// ICE-TCP (tcp.go).

	// DropTCPQueueFull: a packet for a TCP client found its connection's
	// send queue full; the oldest audio frame (or, with none, the oldest
	// frame) was dropped for it.
	DropTCPQueueFull
	// DropTCPNoConnection: a transceiver's packet for a TCP client whose
	// connection is gone (or, without Config.TCPAddr, was never here).
	DropTCPNoConnection

	// NumDropReasons is one more than the largest DropReason; Stats.Drops has this length.
	NumDropReasons
)

var dropNames = [NumDropReasons]string{
	dropNone:                  "none",
	DropUnknownFirstByte:      "unknown_first_byte",
	DropNotSTUNOnMiss:         "not_stun_on_miss",
	DropSTUNMalformed:         "stun_malformed",
	DropSTUNNotBindingRequest: "stun_not_binding_request",
	DropNoUsername:            "no_username",
	DropUsernameMalformed:     "username_malformed",
	DropTokenMalformed:        "token_malformed",
	DropTokenForged:           "token_forged",
	DropTokenUnknownKey:       "token_unknown_key",
	DropTokenExpired:          "token_expired",
	DropWrongCluster:          "wrong_cluster",
	DropUnknownTransceiver:    "unknown_transceiver",
	DropFlowTableFull:         "flow_table_full",
	DropSourceRateLimit:       "source_rate_limit",
	DropSourceRateDelayed:     "source_rate_delayed",
	DropSourcePendingLimit:    "source_pending_limit",
	DropNewFlowRateLimit:      "new_flow_rate_limit",
	DropTransceiverGone:       "transceiver_gone",
	DropUnknownCluster:        "unknown_cluster",
	DropIngressUntrusted:      "ingress_untrusted",
	DropIngressBadHeader:      "ingress_bad_header",
	DropFlowCacheMiss:         "flow_cache_miss",
	DropFlowCacheDown:         "flow_cache_down",
	DropFlowCacheTimeout:      "flow_cache_timeout",
	DropFlowCacheHoldFull:     "flow_cache_hold_full",
	DropFlowCacheStale:        "flow_cache_stale",
	DropInternalUnknownPeer:   "internal_unknown_peer",
	DropInternalBadHeader:     "internal_bad_header",
	DropInternalEmptyPayload:  "internal_empty_payload",
	DropInternalNoFlow:        "internal_no_flow",
	DropInternalFlowMismatch:  "internal_flow_mismatch",
	DropReadError:             "read_error",
	DropWriteError:            "write_error",
	DropTooBig:                "too_big",
	DropTCPQueueFull:          "tcp_queue_full",
	DropTCPNoConnection:       "tcp_no_connection",
}

// String returns the reason's metric label.
func (d DropReason) String() string {
	if d < NumDropReasons {
		return dropNames[d]
	}
	return "unknown"
}
