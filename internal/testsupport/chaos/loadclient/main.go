// Command loadclient is the chaos suite's load driver: many concurrent
// Pion WebRTC sessions in one process, built without the race detector
// by the tests in internal/testsupport/chaos, which run it beside the switchboard
// processes and read its JSON lines from stdout. It is not a product
// command: `switchboard call` is the one-session client.
//
// Mode "media" (the default) runs -sessions sessions, started -ramp apart
// and spread round-robin over -urls. Each offers one sendrecv Opus m-line
// and an "oai-events" data channel, like callclient, streams one RTP
// packet every 20 ms for -duration, and checks the echo: each payload is
// an Opus TOC byte for one 20 ms frame (RFC 6716 §3.1; the transceiver
// paces backend audio by the duration its TOC declares) followed by the
// packet's index (8 bytes, big endian), so every echoed packet names the
// packet it echoes. After streaming it sends a ping on
// the data channel, waits for it to come back, DELETEs the session and
// closes the peer connection. Audio is not Opus-encoded: the transceiver
// and the echo agent pass Opus payloads through untouched, and a counter
// costs no CPU on a 2-core machine that also runs the servers.
//
// A line "mark" on stdin records the moment of a fault (the test writes
// it just before it kills a process); each session then reports the
// largest gap in its received audio that ends within 30 s after the mark.
//
// Mode "vanish" runs -rounds rounds, -concurrency at a time: connect (audio
// and data channel), wait a random 0 to -vanish-max after ICE connects,
// then close the client's UDP sockets without a DELETE, a DTLS
// close_notify or an SCTP ABORT, as a phone that loses its network does.
//
// With -impair-listen, the process also runs an internal/testsupport/impair UDP proxy
// from that address to -impair-target (the relay), with -loss, -dup,
// -reorder and -delay; the transceiver advertises the proxy's address, so
// every client datagram crosses it both ways.
//
// Output, one JSON object per line: {"ev":"connected",...} as each
// session connects, {"ev":"session",...} (media) or {"ev":"vanish",...}
// as each ends, and {"ev":"done",...} last.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/rtp"
	"github.com/pion/transport/v5"
	"github.com/pion/transport/v5/stdnet"
	"github.com/pion/webrtc/v4"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/impair"
)

const (
	frameInterval = 20 * time.Millisecond
	payloadSize   = 60 // a typical 20 ms Opus frame at speech bitrates
	// toc20ms is an Opus TOC byte (RFC 6716 §3.1): configuration 1 (SILK
	// narrowband, 20 ms), mono, code 0 (one frame).
	toc20ms       = 1 << 3
	markWindow    = 30 * time.Second
	preMarkWindow = 5 * time.Second
)

type options struct {
	mode        string
	urls        []string
	sessions    int
	duration    time.Duration
	ramp        time.Duration
	rounds      int
	concurrency int
	vanishMax   time.Duration
	seed        uint64
}

var (
	out   = json.NewEncoder(os.Stdout)
	outMu sync.Mutex
	mark  atomic.Int64 // unix ns of the "mark" line on stdin; 0 before
	httpc = &http.Client{Timeout: 10 * time.Second}
)

func emit(v any) {
	outMu.Lock()
	defer outMu.Unlock()
	_ = out.Encode(v)
}

func main() {
	var o options
	var urls, impairListen, impairTarget string
	var loss, dup, reorder float64
	var delay time.Duration
	flag.StringVar(&o.mode, "mode", "media", "media or vanish")
	flag.StringVar(&urls, "urls", "", "signaling URLs (comma separated), e.g. http://127.0.0.1:8080/v1/calls; sessions go round-robin")
	flag.IntVar(&o.sessions, "sessions", 100, "media: concurrent sessions")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "media: audio streamed per session")
	flag.DurationVar(&o.ramp, "ramp", 30*time.Millisecond, "media: delay between session starts")
	flag.IntVar(&o.rounds, "rounds", 100, "vanish: rounds")
	flag.IntVar(&o.concurrency, "concurrency", 4, "vanish: rounds in flight")
	flag.DurationVar(&o.vanishMax, "vanish-max", 300*time.Millisecond, "vanish: the client vanishes a uniform random 0 to this after ICE connects")
	flag.Uint64Var(&o.seed, "seed", 1, "random seed (vanish delays, impairment)")
	flag.StringVar(&impairListen, "impair-listen", "", "run an impairment proxy on this UDP address")
	flag.StringVar(&impairTarget, "impair-target", "", "the proxy forwards to this UDP address (the relay)")
	flag.Float64Var(&loss, "loss", 0, "proxy: loss probability per datagram and direction")
	flag.Float64Var(&dup, "dup", 0, "proxy: duplication probability")
	flag.Float64Var(&reorder, "reorder", 0, "proxy: probability a datagram is held back so later ones overtake it")
	flag.DurationVar(&delay, "delay", 0, "proxy: one-way delay")
	flag.Parse()
	o.urls = strings.Split(urls, ",")
	if urls == "" {
		fmt.Fprintln(os.Stderr, "loadclient: -urls is required")
		os.Exit(2)
	}

	var proxy *impair.UDP
	if impairListen != "" {
		target, err := netip.ParseAddrPort(impairTarget)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadclient: -impair-target:", err)
			os.Exit(2)
		}
		cfg := impair.Config{Delay: delay, Loss: loss, Duplicate: dup, Reorder: reorder}
		if proxy, err = impair.NewUDP(impairListen, target, cfg, o.seed); err != nil {
			fmt.Fprintln(os.Stderr, "loadclient: proxy:", err)
			os.Exit(1)
		}
	}

	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "mark" {
				now := time.Now().UnixNano()
				mark.Store(now)
				emit(map[string]any{"ev": "mark", "at_ns": now})
			}
		}
	}()

	start := time.Now()
	switch o.mode {
	case "media":
		runMedia(o)
	case "vanish":
		runVanish(o)
	default:
		fmt.Fprintf(os.Stderr, "loadclient: unknown -mode %q\n", o.mode)
		os.Exit(2)
	}
	done := map[string]any{"ev": "done", "elapsed_ms": time.Since(start).Milliseconds()}
	if proxy != nil {
		_ = proxy.Close()
		done["proxy"] = proxy.Stats()
	}
	emit(done)
}

// Session is the report of one media session.
type Session struct {
	Ev      string `json:"ev"`
	I       int    `json:"i"`
	URL     int    `json:"url"` // index into -urls
	Session string `json:"session,omitempty"`

	PostedNS       int64   `json:"posted_ns"`
	ConnectedNS    int64   `json:"connected_ns,omitempty"`
	DisconnectedNS int64   `json:"disconnected_ns,omitempty"` // first ICE "disconnected"
	FailedNS       int64   `json:"failed_ns,omitempty"`       // peer connection "failed"
	ClosedNS       int64   `json:"closed_ns,omitempty"`       // DTLS closed by the server (close_notify)
	ICEFailed      bool    `json:"ice_failed"`
	SetupMS        float64 `json:"setup_ms"`

	Sent       int `json:"sent"`
	Received   int `json:"received"`   // distinct packets echoed back
	Duplicates int `json:"duplicates"` // packets delivered more than once
	Reordered  int `json:"reordered"`  // arrived after a later-sent packet

	MaxGapMS     float64 `json:"max_gap_ms"`      // largest inter-arrival gap while streaming
	GapMarkMS    float64 `json:"gap_mark_ms"`     // largest gap ending within 30 s after the mark
	PreMarkGapMS float64 `json:"pre_mark_gap_ms"` // largest gap in the 5 s before the mark
	LastRxNS     int64   `json:"last_rx_ns,omitempty"`
	StreamEndNS  int64   `json:"stream_end_ns,omitempty"`

	DCOpen    bool   `json:"dc_open"`
	DCEchoEnd bool   `json:"dc_echo_end"`
	Error     string `json:"error,omitempty"`
}

func runMedia(o options) {
	var wg sync.WaitGroup
	for i := range o.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &Session{Ev: "session", I: i, URL: i % len(o.urls)}
			if err := media(o.urls[s.URL], o.duration, s); err != nil {
				s.Error = err.Error()
			}
			emit(s)
		}()
		time.Sleep(o.ramp)
	}
	wg.Wait()
}

func newAPI(n transport.Net) (*webrtc.API, error) {
	var me webrtc.MediaEngine
	if err := me.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2, SDPFmtpLine: "minptime=10;useinbandfec=1"},
		PayloadType:        111,
	}, webrtc.RTPCodecTypeAudio); err != nil {
		return nil, err
	}
	var se webrtc.SettingEngine
	se.SetIncludeLoopbackCandidate(true)
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if n != nil {
		se.SetNet(n)
	}
	// Pion's default ICE timeouts (disconnected 5 s, failed 25 s later,
	// consent checks every 2 s) stand for a browser's.
	return webrtc.NewAPI(webrtc.WithMediaEngine(&me), webrtc.WithSettingEngine(se)), nil
}

// signal POSTs the offer and sets the answer; it returns the session URL.
func signal(pc *webrtc.PeerConnection, target string) (string, error) {
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return "", err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return "", err
	}
	<-gathered
	resp, err := httpc.Post(target, "application/sdp", strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		return "", err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("offer: %s: %s", resp.Status, body)
	}
	base, _ := url.Parse(target)
	loc, err := base.Parse(resp.Header.Get("Location"))
	if err != nil {
		return "", err
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		return loc.String(), err
	}
	return loc.String(), nil
}

func hangup(session string) {
	if session == "" {
		return
	}
	req, _ := http.NewRequest(http.MethodDelete, session, nil)
	if resp, err := httpc.Do(req); err == nil {
		resp.Body.Close()
	}
}

func media(target string, duration time.Duration, s *Session) error {
	api, err := newAPI(nil)
	if err != nil {
		return err
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	defer pc.Close()
	track, err := webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "chaos")
	if err != nil {
		return err
	}
	if _, err := pc.AddTransceiverFromTrack(track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendrecv}); err != nil {
		return err
	}
	dc, err := pc.CreateDataChannel("oai-events", nil)
	if err != nil {
		return err
	}

	var (
		mu       sync.Mutex
		arrivals []int64 // unix ns of each first arrival, in order
		seen     = map[uint64]bool{}
		maxIdx   uint64
		anyRx    bool
	)
	connected := make(chan struct{})
	failed := make(chan struct{})
	dcOpen := make(chan struct{})
	pong := make(chan string, 4)
	var connOnce, failOnce, openOnce sync.Once
	stamp := func(p *int64) {
		mu.Lock()
		if *p == 0 {
			*p = time.Now().UnixNano()
		}
		mu.Unlock()
	}
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		switch st {
		case webrtc.PeerConnectionStateConnected:
			stamp(&s.ConnectedNS)
			connOnce.Do(func() { close(connected) })
		case webrtc.PeerConnectionStateFailed:
			stamp(&s.FailedNS)
			failOnce.Do(func() { close(failed) })
		}
	})
	pc.OnICEConnectionStateChange(func(st webrtc.ICEConnectionState) {
		switch st {
		case webrtc.ICEConnectionStateDisconnected:
			stamp(&s.DisconnectedNS)
		case webrtc.ICEConnectionStateFailed:
			mu.Lock()
			s.ICEFailed = true
			mu.Unlock()
		}
	})
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateClosed {
			stamp(&s.ClosedNS)
			failOnce.Do(func() { close(failed) })
		}
	})
	dc.OnOpen(func() { openOnce.Do(func() { close(dcOpen) }) })
	dc.OnMessage(func(m webrtc.DataChannelMessage) {
		// Only the ping's echo is awaited; the playout events the
		// transceiver also sends here (output_audio_buffer.*) must not
		// crowd it out of the small buffer.
		if !bytes.HasPrefix(m.Data, []byte(`{"type":"ping"`)) {
			return
		}
		select {
		case pong <- string(m.Data):
		default:
		}
	})
	var readers sync.WaitGroup
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		readers.Add(1)
		defer readers.Done()
		buf := make([]byte, 1500)
		var p rtp.Packet
		for {
			n, _, err := tr.Read(buf)
			if err != nil {
				return
			}
			if p.Unmarshal(buf[:n]) != nil || len(p.Payload) < 1+8 {
				continue
			}
			idx := binary.BigEndian.Uint64(p.Payload[1:])
			now := time.Now().UnixNano()
			mu.Lock()
			if seen[idx] {
				s.Duplicates++
			} else {
				seen[idx] = true
				arrivals = append(arrivals, now)
				if anyRx && idx < maxIdx {
					s.Reordered++
				}
				if idx > maxIdx || !anyRx {
					maxIdx = idx
				}
				anyRx = true
			}
			mu.Unlock()
		}
	})

	s.PostedNS = time.Now().UnixNano()
	s.Session, err = signal(pc, target)
	if err != nil {
		return err
	}
	select {
	case <-connected:
	case <-failed:
		return errors.New("peer connection failed before connecting")
	case <-time.After(30 * time.Second):
		return errors.New("not connected after 30s")
	}
	mu.Lock()
	s.SetupMS = float64(s.ConnectedNS-s.PostedNS) / 1e6
	mu.Unlock()
	emit(map[string]any{"ev": "connected", "i": s.I, "url": s.URL, "session": s.Session, "at_ns": s.ConnectedNS})
	select {
	case <-dcOpen:
		s.DCOpen = true
	case <-time.After(10 * time.Second):
	}

	// Stream.
	payload := make([]byte, payloadSize)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	payload[0] = toc20ms
	pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SSRC: rand.Uint32()}, Payload: payload}
	tick := time.NewTicker(frameInterval)
	stop := time.After(duration)
	var sendErr error
stream:
	for idx := uint64(0); ; idx++ {
		select {
		case <-tick.C:
		case <-stop:
			break stream
		case <-failed:
			break stream
		}
		binary.BigEndian.PutUint64(payload[1:], idx)
		pkt.SequenceNumber = uint16(idx)
		pkt.Timestamp = uint32(idx * 960)
		if err := track.WriteRTP(pkt); err != nil && sendErr == nil {
			sendErr = err
		}
		s.Sent++
	}
	tick.Stop()
	streamEnd := time.Now().UnixNano()

	// The end: a ping on the data channel must come back.
	select {
	case <-failed:
	default:
		if s.DCOpen {
			id := fmt.Sprintf(`{"type":"ping","id":"end-%d-%d"}`, s.I, rand.Uint64())
			if err := dc.SendText(id); err == nil {
				deadline := time.After(5 * time.Second)
			wait:
				for {
					select {
					case m := <-pong:
						if m == id {
							s.DCEchoEnd = true
							break wait
						}
					case <-deadline:
						break wait
					case <-failed:
						break wait
					}
				}
			}
		}
		time.Sleep(300 * time.Millisecond) // echoes still in flight
		hangup(s.Session)
	}
	_ = pc.Close()
	readers.Wait()

	mu.Lock()
	defer mu.Unlock()
	s.StreamEndNS = streamEnd
	s.Received = len(arrivals)
	if len(arrivals) > 0 {
		s.LastRxNS = arrivals[len(arrivals)-1]
	}
	gaps(s, arrivals, streamEnd, mark.Load())
	if sendErr != nil && s.FailedNS == 0 {
		return fmt.Errorf("write RTP: %w", sendErr)
	}
	return nil
}

// gaps fills the gap figures from the arrival times: intervals between
// consecutive arrivals up to the end of streaming, and the trailing one
// from the last arrival to the end if it ended earlier.
func gaps(s *Session, arrivals []int64, end, markNS int64) {
	points := slices.Clone(arrivals)
	points = slices.DeleteFunc(points, func(t int64) bool { return t > end })
	if len(points) == 0 {
		return
	}
	points = append(points, end)
	for i := 1; i < len(points); i++ {
		g := float64(points[i]-points[i-1]) / 1e6
		s.MaxGapMS = max(s.MaxGapMS, g)
		if markNS == 0 {
			continue
		}
		if points[i] >= markNS && points[i] <= markNS+int64(markWindow) {
			s.GapMarkMS = max(s.GapMarkMS, g)
		}
		if points[i] < markNS && points[i] >= markNS-int64(preMarkWindow) {
			s.PreMarkGapMS = max(s.PreMarkGapMS, g)
		}
	}
}

// Vanish is the report of one vanish round.
type Vanish struct {
	Ev          string `json:"ev"`
	I           int    `json:"i"`
	Session     string `json:"session,omitempty"`
	ConnectedNS int64  `json:"connected_ns,omitempty"` // ICE connected
	VanishNS    int64  `json:"vanish_ns,omitempty"`
	DTLSUp      bool   `json:"dtls_up"` // DTLS was connected when the client vanished
	DCOpen      bool   `json:"dc_open"` // the data channel was open when the client vanished
	Error       string `json:"error,omitempty"`
}

func runVanish(o options) {
	rounds := make(chan int)
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(w)))
			for i := range rounds {
				v := &Vanish{Ev: "vanish", I: i}
				wait := time.Duration(rng.Int64N(int64(o.vanishMax) + 1))
				if err := vanish(o.urls[i%len(o.urls)], wait, v); err != nil {
					v.Error = err.Error()
				}
				emit(v)
			}
		}()
	}
	for i := range o.rounds {
		rounds <- i
	}
	close(rounds)
	wg.Wait()
}

// vanishNet is the client's network: it remembers the UDP sockets ICE
// opens, so that the client can close them all at once.
type vanishNet struct {
	*stdnet.Net
	mu    sync.Mutex
	conns []io.Closer
}

func (n *vanishNet) ListenUDP(network string, laddr *net.UDPAddr) (transport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err == nil {
		n.mu.Lock()
		n.conns = append(n.conns, c)
		n.mu.Unlock()
	}
	return c, err
}

func (n *vanishNet) ListenPacket(network, address string) (net.PacketConn, error) {
	c, err := n.Net.ListenPacket(network, address)
	if err == nil {
		n.mu.Lock()
		n.conns = append(n.conns, c)
		n.mu.Unlock()
	}
	return c, err
}

func (n *vanishNet) vanish() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		_ = c.Close()
	}
}

func vanish(target string, wait time.Duration, v *Vanish) error {
	std, err := stdnet.NewNet()
	if err != nil {
		return err
	}
	vn := &vanishNet{Net: std}
	defer vn.vanish()
	api, err := newAPI(vn)
	if err != nil {
		return err
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	defer pc.Close()
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio); err != nil {
		return err
	}
	dc, err := pc.CreateDataChannel("oai-events", nil)
	if err != nil {
		return err
	}
	var dcOpen, dtlsUp atomic.Bool
	dc.OnOpen(func() { dcOpen.Store(true) })
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateConnected {
			dtlsUp.Store(true)
		}
	})
	iceUp := make(chan struct{})
	var once sync.Once
	pc.OnICEConnectionStateChange(func(st webrtc.ICEConnectionState) {
		if st == webrtc.ICEConnectionStateConnected {
			once.Do(func() { close(iceUp) })
		}
	})
	v.Session, err = signal(pc, target)
	if err != nil {
		return err
	}
	select {
	case <-iceUp:
	case <-time.After(15 * time.Second):
		return errors.New("ICE not connected after 15s")
	}
	v.ConnectedNS = time.Now().UnixNano()
	time.Sleep(wait)
	vn.vanish()
	v.VanishNS = time.Now().UnixNano()
	v.DTLSUp, v.DCOpen = dtlsUp.Load(), dcOpen.Load()
	return nil
}

var _ transport.Net = (*vanishNet)(nil)
