package transceiver

import (
	"errors"
	"io"

	"github.com/pion/webrtc/v4"
)

// eventsReadSize is the first read buffer of a data channel; a larger
// message doubles it until the message fits, up to eventsMaxSize.
//
// Pion's own read loop keeps a 64 KiB buffer per channel for the life of
// the session, the largest single allocation of an idle voice session;
// oai-events messages are mostly a few hundred bytes. So data channels
// are detached (SettingEngine.DetachDataChannels) and read here.
const eventsReadSize = 2048

// eventsMaxSize bounds a data channel message: Pion's default SCTP
// receive buffer, which no message can exceed. A message that does not
// fit closes the channel's read loop, as Pion's own read loop does.
const eventsMaxSize = 1 << 20

// readDataChannel reads dc's messages until the channel or the peer
// connection closes; it runs as dc's OnOpen handler, in Pion's goroutine
// for it. Messages on oai-events go to the backend, except
// output_audio_buffer.clear, which clears the session's output queue
// (media.go); any other channel is drained and its messages dropped, so
// that it cannot fill the SCTP association's receive window that
// oai-events shares.
func (sess *session) readDataChannel(dc *webrtc.DataChannel, forward bool) {
	raw, err := dc.Detach()
	if err != nil {
		sess.log.Warn("data channel detach", "label", dc.Label(), "err", err)
		return
	}
	buf := make([]byte, eventsReadSize)
	for {
		n, isString, err := raw.ReadDataChannel(buf)
		if errors.Is(err, io.ErrShortBuffer) && len(buf) < eventsMaxSize {
			// The message stays in SCTP's queue for the next read.
			buf = make([]byte, min(2*len(buf), eventsMaxSize))
			continue
		}
		if err != nil {
			return // io.EOF or closed: the channel or the session ended
		}
		if !forward {
			continue
		}
		if isString && isClientClear(buf[:n]) {
			sess.clearOutput("client")
			continue
		}
		if err := sess.be.SendEvent(sess.ctx, buf[:n]); err != nil {
			if sess.ctx.Err() == nil && !sess.ending.Load() {
				sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
			}
			sess.end(ReasonBackendGone)
			return
		}
	}
}
