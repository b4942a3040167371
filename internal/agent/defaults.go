package agent

// DefaultListenAddr is where `switchboard agent` serves its bridge
// (/v1/bridge) and /live, ip:port; transceiver.DefaultBackendURL points
// there.
const DefaultListenAddr = "127.0.0.1:8081"
