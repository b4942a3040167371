// Package setupbench measures call setup latency: the time, and the number
// of round trips, from a client's POST of its SDP offer to the first audio
// frame at the backend (docs/design.md §7, docs/benchmarks.md "Call
// setup").
//
// # What runs
//
// Each path is a real stack on loopback: a transceiver, its signaling HTTP
// server, a backend bridge endpoint in this process, and the callclient
// (Pion) as the client. This machine has no netem, so the RTT is added in
// userspace: an impair.TCP proxy in front of signaling and an impair.UDP
// proxy in front of the media ingress the client uses, each delaying RTT/2
// one way in each direction. The answer's one candidate points at the UDP
// proxy.
//
//	direct  client ─UDP proxy─ transceiver (Direct mode, no relay)
//	relay   client ─UDP proxy─ relay ─internal hop─ transceiver
//	global  client ─UDP proxy─ Global Relay ─hop─ relay ─internal hop─ transceiver
//	tcp     client ─TCP proxy─ relay's ICE-TCP port ─internal hop─ transceiver
//	turn    client ─UDP proxy─ coturn (relay candidate) ─ transceiver (Direct)
//
// For "tcp" the client gathers ICE-TCP candidates only (as on a network
// that drops UDP) and connects to the answer's passive TCP candidate, the
// TCP proxy. The proxy accepts locally, so, as for signaling, the TCP
// handshake (SYN, SYN-ACK) is not delayed: on a real path it adds 1 RTT
// before the first check, which the model below leaves out as it does
// for signaling's connection. The relay carries each RFC 4571 frame over
// the internal hop as for UDP (docs/relay.md, "ICE-TCP"). Chromium selects
// UDP where UDP works, so with Options.Client "chromium" the path is
// skipped; internal/testsupport/e2e TestBrowsersOverTCP runs the browsers where UDP
// is dropped.
//
// For "turn" the client has the TURN server in its ICE servers and the
// "relay" iceTransportPolicy, so every packet goes through coturn; coturn
// sits next to the transceiver (loopback), as a TURN server in the same
// site as the media server would.
//
// The backend echoes audio and events like the echo agent and records when
// the first audio frame of each session arrives. The client's POST start
// (callclient Report.Started) and that arrival are read from the same
// monotonic clock, so "first audio at backend" is exact.
//
// Every path runs with each DTLS role of the transceiver (Config.DTLSRole
// "client" = a=setup:active, "server" = a=setup:passive). Runs are
// interleaved across paths and roles, after one unrecorded warm-up call
// per stack, so that drift on a shared machine hits them alike.
//
// # Round trips, phase by phase (times from the start of the POST)
//
// RTT is the configured round-trip time; "RTT" below is one of them. The
// proxies accept TCP locally, so the TCP (and, in production, TLS)
// handshake of the signaling connection is not delayed: the POST costs
// what it costs on a warm connection. Each count is the earliest the
// protocols allow the way this client (Pion) runs them.
//
//	answer received   1     the POST and its 201 (the answer is complete:
//	                        ICE-lite credentials and the one candidate)
//	ICE connected     +2    Pion, as the controlling full agent facing an
//	                        ICE-lite server, uses regular nomination: a check
//	                        (1 RTT) makes the pair valid, then a check with
//	                        USE-CANDIDATE (1 RTT) nominates it. The ICE-lite
//	                        server never checks; it selects the pair when the
//	                        nomination arrives, 0.5 RTT after it was sent.
//	                        TURN: +1 before the first check, the client's
//	                        CreatePermission on the TURN server.
//	DTLS connected    +2    DTLS 1.2 full handshake, counted at the client.
//	                        Role "client": the transceiver sends ClientHello
//	                        right after answering the client's first
//	                        authenticated check; Pion's DTLS starts only
//	                        once its own ICE is connected (after the
//	                        nomination), keeping the ClientHello until then,
//	                        and as DTLS server answers with a
//	                        HelloVerifyRequest (+1), then ServerHello…Done
//	                        (+1 to get the client's Finished). Role
//	                        "server": the client sends ClientHello once its
//	                        ICE is connected; the transceiver skips the
//	                        HelloVerifyRequest; 2 RTT to the server's
//	                        Finished. Both roles: +2. With a client whose
//	                        DTLS server sends no HelloVerifyRequest
//	                        (Options.ClientSkipHelloVerify), role "client"
//	                        takes +1: the ClientHello was waiting for it.
//	first audio at    +0.5  the client sends its first RTP once connected;
//	backend                 half a round trip to the transceiver, then the
//	                        bridge (loopback).
//	first echo at     +0.5  back to the client.
//	client
//
// So the Pion client reaches the backend at 5.5 RTT on direct and relay
// (4.5 with role "client" and a client that skips HelloVerify), and 6.5
// through TURN, which also spends 2 RTT before the POST allocating its
// relay candidate (Allocate, 401 with nonce, authenticated Allocate): the
// offer is complete, so the POST waits for gathering (reported as
// "gather").
//
// The data channel does not gate audio. With SCTP SNAP (a=sctp-init, both
// sides here) the association needs no INIT/COOKIE round trips (2 RTT);
// Pion's client then fires OnOpen on the DCEP ACK, 1 RTT after DTLS
// connects (RFC 8832 would let it send at once). The harness reports it.
//
// # The client's check timer
//
// Pion's ICE agent runs its connecting-phase task every 200 ms
// (ice.AgentConfig.CheckInterval, not exposed by webrtc.SettingEngine in
// v4.2.26). The first check leaves at once, but the nomination waits for
// the next tick after the first check's response: ICE then takes
// 200 ms + 1 RTT instead of 2 RTT. The task loop runs at the smallest of
// the check interval and the disconnected and failed timeouts, so the
// harness sets SettingEngine.SetICETimeouts(disconnected = ClientICETick
// (5 ms), failed = 30 s, keepalive = 2 s): the nomination leaves within
// one tick of the valid pair and the numbers show protocol round trips, not
// a client timer. Side effects, harmless for a short call: the client
// sends a consent check every tick once connected, and its ICE state
// blinks "disconnected" between packets (callclient therefore starts its
// audio when DTLS connects over a connected ICE transport, not on the
// aggregate peer connection state, which would follow the blinking). Set
// Options.ClientICETick to 200 ms to measure Pion's default: ICE then
// takes about 200 ms + 1 RTT after the answer.
//
// Pion also waits 2 s (RelayAcceptanceMinWait) before it nominates a
// relay pair, in case a direct pair succeeds; with the relay policy there
// is none, so the harness sets that wait to 0.
//
// # Headless Chromium
//
// With Options.Client "chromium" the client is the demo page
// (internal/web) in one headless Chromium per run, a fresh tab per call
// (chromium.go). Each stack's signaling server also serves the page at
// "/", so the page and the offer share an origin through the same delay
// proxy (no CORS preflight). The page calls
// window.switchboard.call({url, iceServers, iceTransportPolicy}) and
// times each phase from its POST start on performance.now(): answer, ICE
// "connected", DTLS "connected", first inbound audio (getStats polled
// every 5 ms). The backend's first-frame time is mapped onto the page's
// clock by reading performance.now() between two readings of ours (the
// tightest of five brackets, typically under 1 ms). Chromium on the
// wire, unlike Pion: its ICE state is "connected" once the first check
// succeeds, before it nominates (USE-CANDIDATE on the pair's next
// scheduled check, 0–60 ms later); it keeps up to four ClientHellos that
// come before and answers them as the pair becomes writable; its DTLS
// server sends no HelloVerifyRequest; through TURN it sends
// CreatePermission and the first check back to back. The transceiver
// starts DTLS on the first authenticated check, so with role "client"
// (expectedChromium) its ClientHello is there when Chromium's pair becomes
// writable: 1 + 1 + 1 + 0.5 = 3.5 RTT to the backend; role "server" takes
// one more.
//
// # DTLS 1.3 and SPED
//
// Options.DTLSVersions runs every client, path and role with each of the
// transceiver's -dtls-version settings. Chromium and Firefox negotiate DTLS
// 1.3 when it is offered, Pion stays on 1.2 (pion/dtls v3). In role
// server DTLS 1.3 takes a round trip less than 1.2 (the browser, DTLS
// client, is done as it takes the transceiver's first flight), in role
// client as long (the browser, DTLS server, waits for the transceiver's
// Finished either way): both 1 RTT after ICE (expectedFor).
//
// "chromium-sped" is Chromium with its field trial WebRTC-IceHandshakeDtls
// (SPED, internal/peer sped.go): its ClientHello rides its first check,
// and the transceiver, the DTLS 1.3 server, answers in the Binding
// response. Chromium 156's ClientHello carries a post-quantum key share
// (X25519MLKEM768, its feature WebRtcPqcForDtls) and spans two datagrams:
// the second leaves only once the first check's response has made
// Chromium's ICE writable, so its handshake ends 2 RTT after its first
// check, as without SPED. "chromium-sped-nopq" turns that feature off: a
// ClientHello of one datagram, answered in the first response, and
// Chromium is DTLS connected with it: ICE and DTLS at 2 RTT from the POST,
// first audio at the backend at 2.5 (expectedSPED).
//
// # Headless Firefox ESR
//
// With Options.Client "firefox" the client is the same page in headless
// Firefox ESR, in a network namespace of the run's (it calls no server on
// loopback), driving itself (firefox.go). Firefox nominates on its first
// check and drops DTLS that reaches it before its ICE layer is up, so
// its model is Chromium's, with a dropped ClientHello left to the
// transceiver's retransmission, 2.5 × (answer → first check) later.
//
// # Loss
//
// Options.Loss drops datagrams at random on the media proxy, each way;
// Options.DropFlight drops each call's first DTLS datagram one way. The
// transceiver retransmits its DTLS flights 2.5 × (answer → first check)
// after sending them (internal/peer, dtls.go), and sends its ClientHello
// again on a later check from the client while the client has sent no
// DTLS; Pion's client retransmits after 1 s, doubling.
//
// # Reaching 3 RTT
//
// (Written before SPED; see "DTLS 1.3 and SPED" above for what it reaches.)
// With DTLS 1.2 behind ICE, 3 RTT from the POST to audio at the backend is
// out of reach whatever the roles: the server's first packet can reach
// the client at 2 RTT at the earliest (answer 1, the client's first check
// 0.5, the server's reply 0.5), and a full DTLS 1.2 handshake needs 1 more
// RTT before the client may send, then 0.5 RTT for the audio: 3.5 RTT,
// which the transceiver in role "client" now allows every client whose DTLS
// server keeps a ClientHello that came early and sends no
// HelloVerifyRequest (Chromium; Firefox when it does not drop it). Below
// 3.5 needs the handshake to ride on the ICE checks (DTLS-in-STUN,
// draft-hancke-webrtc-sped: ClientHello in the first check, the server's
// flight in its response) with DTLS 1.3 (a 1-RTT handshake), on both ends.
package setupbench
