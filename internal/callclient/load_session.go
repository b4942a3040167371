package callclient

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/transport/v5"
	"github.com/pion/transport/v5/stdnet"
	"github.com/pion/webrtc/v4"
)

// loadSession is the state one session's callbacks share.
type loadSession struct {
	r  *SessionResult
	mu sync.Mutex // guards r's times and the receive state

	arrivals []int64  // unix ns of each first arrival, in order
	seen     []uint64 // bitset of extended sequence numbers received
	maxExt   uint64   // highest extended sequence number received
	anyRx    bool
}

// stamp records now into *p once.
func (s *loadSession) stamp(p *int64) {
	s.mu.Lock()
	if *p == 0 {
		*p = time.Now().UnixNano()
	}
	s.mu.Unlock()
}

// receive records one echoed packet with sequence number seq; it reports
// whether it was new.
func (s *loadSession) receive(seq uint16, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recordLocked(extendSeq(s.maxExt, s.anyRx, seq), now)
}

// extendSeq extends the 16-bit seq to the 64-bit count nearest to maxExt,
// the highest extended sequence number seen so far (RFC 3550 §A.1): a
// small step back is a late packet, a large one a wrap.
func extendSeq(maxExt uint64, any bool, seq uint16) uint64 {
	if !any {
		return uint64(seq)
	}
	ext := maxExt&^0xffff | uint64(seq)
	switch {
	case ext > maxExt && ext-maxExt > 1<<15 && ext >= 1<<16:
		ext -= 1 << 16
	case ext < maxExt && maxExt-ext > 1<<15:
		ext += 1 << 16
	}
	return ext
}

func (s *loadSession) recordLocked(ext uint64, now int64) bool {
	w := int(ext / 64)
	if w >= len(s.seen) {
		s.seen = append(s.seen, make([]uint64, w+1-len(s.seen))...)
	}
	bit := uint64(1) << (ext % 64)
	if s.seen[w]&bit != 0 {
		s.r.Duplicates++
		return false
	}
	s.seen[w] |= bit
	s.arrivals = append(s.arrivals, now)
	if s.anyRx && ext < s.maxExt {
		s.r.Reordered++
	}
	if !s.anyRx || ext > s.maxExt {
		s.maxExt = ext
	}
	s.anyRx = true
	return true
}

// session runs session i to its end and returns its result: it builds
// the peer connection (dial), posts the offer (signal), waits for it to
// connect, streams the audio, says goodbye (hangUp) and sums up what came
// back (measure).
func (l *Load) session(ctx context.Context, i int) SessionResult {
	c := &loadRun{l: l, r: SessionResult{I: i, URLIndex: i % len(l.opts.URLs)}}
	c.s = &loadSession{r: &c.r}
	l.started.Add(1)
	api, err := c.newAPI()
	if c.vn != nil {
		defer c.vn.vanish()
	}
	if err != nil {
		return c.fail(FailClient, err)
	}
	err = c.dial(api)
	if c.pc != nil {
		defer c.pc.Close()
	}
	if err != nil {
		return c.fail(FailClient, err)
	}
	c.watch()
	defer c.closePC()

	cctx, cancel := context.WithTimeout(ctx, l.opts.ConnectTimeout)
	defer cancel()
	c.r.PostedNS = time.Now().UnixNano()
	session, err := l.signal(cctx, c.pc, l.targets[c.r.URLIndex])
	c.r.Session, c.session = session, session
	if err != nil {
		l.hangup(session)
		return c.fail(FailSignaling, err)
	}
	if c.vn != nil {
		return l.vanish(ctx, cctx, &c.r, c.s, c.vn, c.iceUp, c.failed, c.dcOpen, c.closePC, c.fail)
	}
	if reason, err := c.waitConnected(cctx); err != nil {
		l.hangup(session)
		return c.fail(reason, err)
	}
	l.connected.Add(1)
	l.live.Add(1)
	defer l.live.Add(-1)
	c.reportConnected()
	c.waitDataChannel()

	sendErr := l.stream(ctx, c.track, c.failed, &c.r)
	streamEnd := time.Now().UnixNano()
	if !c.r.DCOpen {
		// Opened while the audio streamed: on a lossy path SCTP's
		// association and the channel's DCEP open each retransmit on
		// timers from 1 s, doubled on each loss (RFC 4960 §6.3.3), so
		// four losses in a row take one of them past the 10 s of
		// waitDataChannel.
		select {
		case <-c.dcOpen:
			c.r.DCOpen = true
		default:
		}
	}
	c.hangUp()
	c.closePC()
	return c.measure(streamEnd, sendErr)
}

// loadRun is one session of a load run from its start to its end: its
// peer connection, the channels its callbacks close, and its result. Only
// the goroutine running Load.session touches its fields after watch,
// except r, which callbacks update under s.mu.
type loadRun struct {
	l       *Load
	r       SessionResult
	s       *loadSession
	vn      *vanishNet // nil unless the session vanishes (LoadOptions.Vanish)
	session string     // the session URL, "" before signaling or when none

	pc    *webrtc.PeerConnection
	track *webrtc.TrackLocalStaticRTP
	tr    *webrtc.RTPTransceiver
	dc    *webrtc.DataChannel

	// Closed once each, by the peer connection's callbacks.
	connected, failed, dcOpen, iceUp chan struct{}
	pong                             chan string // the IDs of ping echoes

	readers sync.WaitGroup // the RTP and RTCP readers
	closing atomic.Bool    // set when the peer connection closes: no new readers
}

// fail ends the session with a failure: reason, one of the Fail…
// constants, and err.
func (c *loadRun) fail(reason string, err error) SessionResult {
	c.r.Failure, c.r.Error = reason, err.Error()
	c.l.failed.Add(1)
	c.l.ended.Add(1)
	return c.r
}

// newAPI returns the API the session's peer connection is made with: the
// load's own, or, for a session that vanishes, one on sockets of its
// own, to close at once (c.vn, set even when the API then fails).
func (c *loadRun) newAPI() (*webrtc.API, error) {
	if c.l.opts.Vanish <= 0 {
		return c.l.api, nil
	}
	std, err := stdnet.NewNet()
	if err != nil {
		return nil, err
	}
	c.vn = &vanishNet{Net: std}
	return newLoadAPI(c.l.opts.SettingEngine, c.vn, c.l.opts.Network)
}

// dial makes the peer connection (c.pc, set as soon as it exists) with
// its sendrecv Opus track and its data channel.
func (c *loadRun) dial(api *webrtc.API) error {
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	c.pc = pc
	c.track, err = webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "switchboard-load")
	if err != nil {
		return err
	}
	c.tr, err = pc.AddTransceiverFromTrack(c.track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendrecv})
	if err != nil {
		return err
	}
	c.dc, err = pc.CreateDataChannel(DataChannelLabel, nil)
	return err
}

// watch sets the peer connection's callbacks, which stamp the session's
// state changes into c.r and close c's channels, and starts the readers
// of RTP and RTCP; closePC stops them.
func (c *loadRun) watch() {
	s, r, pc := c.s, &c.r, c.pc
	c.connected, c.failed, c.dcOpen = make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.iceUp = make(chan struct{})
	c.pong = make(chan string, 4)
	var connOnce, failOnce, openOnce, iceOnce sync.Once
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		switch st {
		case webrtc.PeerConnectionStateConnected:
			s.stamp(&r.ConnectedNS)
			connOnce.Do(func() { close(c.connected) })
		case webrtc.PeerConnectionStateFailed:
			s.stamp(&r.FailedNS)
			failOnce.Do(func() { close(c.failed) })
		}
	})
	pc.OnICEConnectionStateChange(func(st webrtc.ICEConnectionState) {
		switch st {
		case webrtc.ICEConnectionStateConnected:
			iceOnce.Do(func() { close(c.iceUp) })
		case webrtc.ICEConnectionStateDisconnected:
			s.stamp(&r.DisconnectedNS)
		case webrtc.ICEConnectionStateFailed:
			s.mu.Lock()
			r.ICEFailed = true
			s.mu.Unlock()
		}
	})
	pc.SCTP().Transport().OnStateChange(func(st webrtc.DTLSTransportState) {
		if st == webrtc.DTLSTransportStateClosed {
			s.stamp(&r.ClosedNS)
			failOnce.Do(func() { close(c.failed) })
		}
	})
	c.dc.OnOpen(func() { openOnce.Do(func() { close(c.dcOpen) }) })
	c.dc.OnMessage(func(m webrtc.DataChannelMessage) {
		// Only the ping's echo is awaited: the events a transceiver also
		// sends here (output_audio_buffer.*) must not crowd it out.
		var echo struct{ Type, ID string }
		if json.Unmarshal(m.Data, &echo) != nil || echo.Type != "ping" {
			return
		}
		select {
		case c.pong <- echo.ID:
		default:
		}
	})
	c.readers.Go(func() { // RTCP from the server, so that the report interceptors see it
		buf := make([]byte, 1500)
		for {
			if _, _, err := c.tr.Sender().Read(buf); err != nil {
				return
			}
		}
	})
	pc.OnTrack(func(t *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		if c.closing.Load() {
			return
		}
		c.readers.Add(1)
		defer c.readers.Done()
		buf := make([]byte, 1500)
		var h rtp.Header
		for {
			n, _, err := t.Read(buf)
			if err != nil {
				return
			}
			if _, err := h.Unmarshal(buf[:n]); err != nil {
				continue
			}
			if s.receive(h.SequenceNumber, time.Now().UnixNano()) {
				c.l.received.Add(1)
			}
		}
	})
}

// closePC closes the peer connection and waits for the readers watch
// started. It may be called more than once.
func (c *loadRun) closePC() {
	c.closing.Store(true)
	_ = c.pc.Close()
	c.readers.Wait()
}

// waitConnected waits for the peer connection to connect; when it fails
// first, or cctx ends, it returns the failure's reason and error.
func (c *loadRun) waitConnected(cctx context.Context) (string, error) {
	select {
	case <-c.connected:
		return "", nil
	case <-c.failed:
		return FailConnect, fmt.Errorf("peer connection failed before connecting; %s", connectHint(remoteSDP(c.pc)))
	case <-cctx.Done():
		return FailConnectTimeout, fmt.Errorf("not connected after %v; %s", c.l.opts.ConnectTimeout, connectHint(remoteSDP(c.pc)))
	}
}

// reportConnected records the setup time and hands a snapshot of the
// result to LoadOptions.OnConnected.
func (c *loadRun) reportConnected() {
	c.s.mu.Lock()
	c.r.SetupMS = float64(c.r.ConnectedNS-c.r.PostedNS) / 1e6
	snapshot := c.r
	c.s.mu.Unlock()
	if c.l.opts.OnConnected != nil {
		c.l.opts.OnConnected(snapshot)
	}
}

// waitDataChannel waits up to 10 s for the data channel to open, unless
// the session fails first.
func (c *loadRun) waitDataChannel() {
	dcWait := time.NewTimer(10 * time.Second)
	select {
	case <-c.dcOpen:
		c.r.DCOpen = true
	case <-c.failed:
	case <-dcWait.C:
	}
	dcWait.Stop()
}

// hangUp ends a session that has not failed: when the data channel is
// open it checks that it still echoes (closingPing, unless NoEcho), then
// waits LoadTail for the last echoed audio and DELETEs the session.
func (c *loadRun) hangUp() {
	select {
	case <-c.failed:
		return
	default:
	}
	if c.r.DCOpen && !c.l.opts.NoEcho && c.closingPing() {
		c.r.DCEchoEnd = true
	}
	time.Sleep(LoadTail)
	c.l.hangup(c.session)
}

// closingPing sends a ping on the data channel and reports whether its
// echo came back within closingPingWait, before the session failed.
func (c *loadRun) closingPing() bool {
	var id [8]byte
	_, _ = rand.Read(id[:])
	pingID := fmt.Sprintf("load-%d-%x", c.r.I, id)
	if err := c.dc.SendText(fmt.Sprintf(`{"type":"ping","id":%q}`, pingID)); err != nil {
		return false
	}
	deadline := time.NewTimer(closingPingWait)
	defer deadline.Stop()
	for {
		select {
		case got := <-c.pong:
			if got == pingID {
				return true
			}
		case <-deadline.C:
			return false
		case <-c.failed:
			return false
		}
	}
}

// measure sums up the ended session, whose audio stopped at streamEnd
// (unix ns) with the first write error sendErr, and returns its result:
// what was received, the gaps, and the failure, if any.
func (c *loadRun) measure(streamEnd int64, sendErr error) SessionResult {
	l, s, r := c.l, c.s, &c.r
	s.mu.Lock()
	defer s.mu.Unlock()
	r.StreamEndNS = streamEnd
	r.Received = len(s.arrivals)
	if len(s.arrivals) > 0 {
		r.LastRxNS = s.arrivals[len(s.arrivals)-1]
	}
	gaps(r, s.arrivals, streamEnd, l.mark.Load())
	l.ended.Add(1)
	switch {
	case r.FailedNS != 0 || (r.ClosedNS != 0 && r.ClosedNS < streamEnd):
		r.Failure = FailDropped
	case sendErr != nil:
		r.Failure, r.Error = FailDropped, fmt.Sprintf("write RTP: %v", sendErr)
	case !r.DCOpen || (!r.DCEchoEnd && !l.opts.NoEcho):
		r.Failure = FailDataChannel
	}
	if r.Failure != "" {
		l.failed.Add(1)
	}
	return *r
}

// vanish runs a Vanish session from its signaling on: it waits for ICE
// to connect, then a random 0 to Vanish, and closes the sockets; closePC
// then closes the peer connection, whose goodbyes go nowhere.
func (l *Load) vanish(ctx, cctx context.Context, r *SessionResult, s *loadSession, vn *vanishNet, iceUp, failed, dcOpen <-chan struct{}, closePC func(), fail func(string, error) SessionResult) SessionResult {
	select {
	case <-iceUp:
	case <-failed:
		return fail(FailConnect, errors.New("peer connection failed before ICE connected"))
	case <-cctx.Done():
		return fail(FailConnectTimeout, fmt.Errorf("ICE not connected after %v", l.opts.ConnectTimeout))
	}
	l.connected.Add(1)
	wait := time.NewTimer(time.Duration(mrand.Int64N(int64(l.opts.Vanish) + 1)))
	select {
	case <-wait.C:
	case <-ctx.Done():
		wait.Stop()
	}
	vn.vanish()
	vanished := time.Now().UnixNano()
	select {
	case <-dcOpen:
		r.DCOpen = true
	default:
	}
	closePC()
	l.ended.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	r.VanishedNS = vanished
	// The peer connection reached "connected" only if DTLS finished
	// before the session vanished; one that vanished first has no setup
	// time (and ConnectedNS 0), not a setup time of 0.
	if r.ConnectedNS != 0 {
		r.SetupMS = float64(r.ConnectedNS-r.PostedNS) / 1e6
	}
	return *r
}

// vanishNet is a vanishing session's network: it remembers the UDP
// sockets ICE opens, so that the session can close them all at once.
type vanishNet struct {
	*stdnet.Net
	mu     sync.Mutex
	conns  []io.Closer
	closed bool
}

var _ transport.Net = (*vanishNet)(nil)

// ListenUDP opens a socket as stdnet does and remembers it.
func (n *vanishNet) ListenUDP(network string, laddr *net.UDPAddr) (transport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err == nil {
		n.keep(c)
	}
	return c, err
}

// ListenPacket opens a socket as stdnet does and remembers it.
func (n *vanishNet) ListenPacket(network, address string) (net.PacketConn, error) {
	c, err := n.Net.ListenPacket(network, address)
	if err == nil {
		n.keep(c)
	}
	return c, err
}

// keep remembers c, or closes it at once after vanish.
func (n *vanishNet) keep(c io.Closer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		_ = c.Close()
		return
	}
	n.conns = append(n.conns, c)
}

// vanish closes every socket, and any opened later.
func (n *vanishNet) vanish() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

// stream sends one packet every 20 ms for Duration, until failed closes
// or ctx ends, and returns the first write error.
func (l *Load) stream(ctx context.Context, track *webrtc.TrackLocalStaticRTP, failed <-chan struct{}, r *SessionResult) error {
	var ssrc [4]byte
	_, _ = rand.Read(ssrc[:])
	pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: OpusPayloadType, SSRC: binary.BigEndian.Uint32(ssrc[:])}}
	counter := newCounterPayload()
	tick := time.NewTicker(frameDuration)
	defer tick.Stop()
	stop := time.NewTimer(l.opts.Duration)
	defer stop.Stop()
	var sendErr error
	for idx := uint64(0); ; idx++ {
		select {
		case <-tick.C:
		case <-stop.C:
			return sendErr
		case <-failed:
			return sendErr
		case <-ctx.Done():
			return sendErr
		}
		if l.frames != nil {
			pkt.Payload = l.frames[idx%uint64(len(l.frames))]
		} else {
			binary.BigEndian.PutUint64(counter[1:], idx)
			pkt.Payload = counter
		}
		pkt.SequenceNumber = uint16(idx)
		pkt.Timestamp = uint32(idx * 960)
		if err := track.WriteRTP(pkt); err != nil && sendErr == nil {
			sendErr = err
		}
		r.Sent++
		l.sent.Add(1)
	}
}

// newCounterPayload returns a counter payload with index 0: loadTOC, the
// index, filler.
func newCounterPayload() []byte {
	p := make([]byte, loadPayloadSize)
	for i := range p {
		p[i] = byte(i * 7)
	}
	p[0] = loadTOC
	binary.BigEndian.PutUint64(p[1:], 0)
	return p
}

// signal POSTs the complete offer and applies the answer; it returns the
// absolute session URL ("" if there is none).
func (l *Load) signal(ctx context.Context, pc *webrtc.PeerConnection, target *url.URL) (string, error) {
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return "", err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return "", err
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return "", fmt.Errorf("ICE gathering: %w", ctx.Err())
	}
	answer, session, _, err := l.signaling().post(ctx, l.opts.HTTPClient, target, pc.LocalDescription().SDP)
	if err != nil {
		return "", err
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: answer}); err != nil {
		return session.String(), fmt.Errorf("%w: set remote description: %w", ErrSignaling, err)
	}
	return session.String(), nil
}

// hangup DELETEs the session, if there is one; failures are ignored (the
// server ends the session on its own when the client goes).
func (l *Load) hangup(session string) {
	if session == "" {
		return
	}
	u, err := url.Parse(session)
	if err != nil {
		return
	}
	_ = l.signaling().delete(context.Background(), l.opts.HTTPClient, u)
}

// remoteSDP returns pc's remote description, or "" before one is set.
func remoteSDP(pc *webrtc.PeerConnection) string {
	if d := pc.RemoteDescription(); d != nil {
		return d.SDP
	}
	return ""
}

// signaling returns a call carrying only what post and delete use: the
// headers.
func (l *Load) signaling() *call {
	return &call{opts: Options{AuthToken: l.opts.AuthToken, Header: l.opts.Header}}
}
