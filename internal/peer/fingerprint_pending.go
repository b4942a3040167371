package peer

// Fingerprint is one a=fingerprint (RFC 8122 §5): a hash function name,
// lower case ("sha-256"), and its digest.
//
// It stands in for the declaration of sdp.go (branch peersdp, contract in
// PEER-API.md) until that merges; this file goes then.
type Fingerprint struct {
	Hash   string
	Digest []byte
}
