package transceiver

import (
	"errors"
	"io"

	"github.com/pion/datachannel"
)

// eventsReadSize is the first read buffer of a data channel; a larger
// message doubles it until the message fits, up to eventsMaxSize.
//
// Pion's PeerConnection keeps a 64 KiB buffer per channel for the life of
// the session, the largest single allocation of an idle voice session;
// oai-events messages are mostly a few hundred bytes. internal/peer hands
// over data channels detached (pion/datachannel), and they are read here.
const eventsReadSize = 2048

// eventsMaxSize bounds a data channel message: pion/sctp's default
// receive buffer, which no message can exceed, and the answer's
// a=max-message-size. A message that does not fit closes the channel's
// read loop, as Pion's own read loop does.
const eventsMaxSize = 1 << 20

// sendText sends msg on dc as a text message (DCEP's PPID for a UTF-8
// string, RFC 8831 §6.6).
func sendText(dc *datachannel.DataChannel, msg []byte) error {
	_, err := dc.WriteDataChannel(msg, true)
	return err
}

// readDataChannel reads dc's messages until the channel or the peer
// session closes, on a goroutine of its own that Server.wg tracks. Messages on oai-events go to the backend, except
// output_audio_buffer.clear, which clears the session's output queue
// (media.go); any other channel is drained and its messages dropped, so
// that it cannot fill the SCTP association's receive window that
// oai-events shares.
func (sess *session) readDataChannel(dc *datachannel.DataChannel, forward bool) {
	defer sess.srv.wg.Done()
	buf := make([]byte, eventsReadSize)
	for {
		n, isString, err := dc.ReadDataChannel(buf)
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
