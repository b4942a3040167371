package transceiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pion/datachannel"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
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
			sess.media.clearOutput("client")
			continue
		}
		if err := sess.be.SendEvent(sess.ctx, buf[:n]); err != nil {
			if sess.ctx.Err() == nil && !sess.ending.Load() {
				sess.srv.metrics.bridgeErrors.WithLabelValues("send").Inc()
			}
			sess.end(bridge.ReasonBackendGone)
			return
		}
	}
}

// OpenAI Realtime server events the transceiver itself sends the client on
// oai-events: turn detection's and the idle timeout's (unless the
// backend's hello opted out of input_audio_buffer events), playout's
// (unless it opted out of output_audio_buffer events), and the end event,
// always.
const (
	clientSpeechStartedType = "input_audio_buffer.speech_started"
	clientSpeechStoppedType = "input_audio_buffer.speech_stopped"
	clientTimeoutType       = "input_audio_buffer.timeout_triggered"
	clientStartedType       = "output_audio_buffer.started"
	clientStoppedType       = "output_audio_buffer.stopped"
	clientClearedType       = "output_audio_buffer.cleared"
	// Switchboard's own, for what OpenAI has no event for: speech over
	// the reply paused its playout, and the reply resumed (that speech
	// was a cough or a backchannel, not a turn).
	clientPausedType  = "switchboard.output_audio_buffer.paused"
	clientResumedType = "switchboard.output_audio_buffer.resumed"
)

// EndEventType is the type of the event the transceiver sends on
// oai-events just before it ends a session, e.g.
// {"type":"switchboard.session.end","event_id":"event_sb_…_12","reason":"shutdown"}.
const EndEventType = "switchboard.session.end"

// clientClearType is the OpenAI Realtime client event that clears the
// output audio buffer, accepted on oai-events.
const clientClearType = "output_audio_buffer.clear"

// clientEvent is every event clientEvents sends, shaped as OpenAI's
// Realtime API sends its server events: type, event_id, then the
// members of its type.
type clientEvent struct {
	Type         string `json:"type"`
	EventID      string `json:"event_id"`
	AudioStartMs *int64 `json:"audio_start_ms,omitempty"`
	AudioEndMs   *int64 `json:"audio_end_ms,omitempty"`
	ItemID       string `json:"item_id,omitempty"`
	ResponseID   string `json:"response_id,omitempty"`
	Reason       string `json:"reason,omitempty"`
}

// clientEvents is a session's oai-events channel: the events the
// transceiver sends the client of its own, and the backend's, forwarded.
// Event ids are event_sb_<session>_<n>, n counting every event sent or
// dropped from 1; user item ids item_sb_<session>_<n>, one per speech
// start or idle timeout. The channel is the peer session's goroutine's to
// set (open); the rest is safe for concurrent use except items and item,
// which the media path's turnMu guards (speech starts and stops on the
// track goroutine, idle timeouts on their timer's).
type clientEvents struct {
	// Set once: the id prefixes, and which events the backend's hello
	// asked for (before any goroutine that sends starts).
	eventPrefix, itemPrefix string
	input, output           bool
	dropped                 prometheus.Counter // events that could not be sent

	dc    atomic.Pointer[datachannel.DataChannel] // oai-events, once the client opened it
	ids   atomic.Uint64
	items uint64 // guarded by the media path's turnMu: user items started
	item  string // guarded by the media path's turnMu: the current user item's id
}

func newClientEvents(sessionID string, dropped prometheus.Counter) *clientEvents {
	return &clientEvents{eventPrefix: "event_sb_" + sessionID + "_", itemPrefix: "item_sb_" + sessionID + "_", dropped: dropped}
}

// open takes dc as the oai-events channel and reports whether it is the
// first (the session bridges one).
func (ce *clientEvents) open(dc *datachannel.DataChannel) bool {
	return ce.dc.CompareAndSwap(nil, dc)
}

// opened reports whether the client opened oai-events.
func (ce *clientEvents) opened() bool { return ce.dc.Load() != nil }

// forward sends the client a backend event as it came, and reports
// whether it could (not before the client opened oai-events).
func (ce *clientEvents) forward(msg []byte) bool {
	dc := ce.dc.Load()
	return dc != nil && sendText(dc, msg) == nil
}

// speechStarted starts a user item and sends input_audio_buffer.speech_started
// at audioMs (turnMu held).
func (ce *clientEvents) speechStarted(audioMs int64) {
	ce.newItem()
	if ce.input {
		ce.emit(clientEvent{Type: clientSpeechStartedType, AudioStartMs: &audioMs, ItemID: ce.item})
	}
}

// newItem starts a user item (turnMu held).
func (ce *clientEvents) newItem() {
	ce.items++
	ce.item = ce.itemPrefix + strconv.FormatUint(ce.items, 10)
}

// timeoutTriggered sends input_audio_buffer.timeout_triggered for the
// quiet audio from startMs to endMs, as a user item of its own, as
// OpenAI's Realtime API does (turnMu held).
func (ce *clientEvents) timeoutTriggered(startMs, endMs int64) {
	ce.newItem()
	if ce.input {
		ce.emit(clientEvent{Type: clientTimeoutType, AudioStartMs: &startMs, AudioEndMs: &endMs, ItemID: ce.item})
	}
}

// speechStopped sends input_audio_buffer.speech_stopped at audioMs for
// the current user item (turnMu held).
func (ce *clientEvents) speechStopped(audioMs int64) {
	if ce.input {
		ce.emit(clientEvent{Type: clientSpeechStoppedType, AudioEndMs: &audioMs, ItemID: ce.item})
	}
}

// playout sends an output_audio_buffer event of typ for the response
// responseID ("": untagged audio).
func (ce *clientEvents) playout(typ, responseID string) {
	if ce.output {
		ce.emit(clientEvent{Type: typ, ResponseID: responseID})
	}
}

// end tells the client why the session ends and waits briefly for the
// message to leave.
func (ce *clientEvents) end(reason string) {
	dc := ce.dc.Load()
	if dc == nil || ce.send(clientEvent{Type: EndEventType, Reason: reason}) != nil {
		return
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for dc.BufferedAmount() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// emit sends ev, if the client opened oai-events; a failed send is
// counted.
func (ce *clientEvents) emit(ev clientEvent) {
	if err := ce.send(ev); err != nil && err != errNoEvents {
		ce.dropped.Inc()
	}
}

// errNoEvents: the client has not opened oai-events.
var errNoEvents = errors.New("transceiver: no oai-events channel")

// send marshals ev with the next event id and sends it.
func (ce *clientEvents) send(ev clientEvent) error {
	dc := ce.dc.Load()
	if dc == nil {
		return errNoEvents
	}
	ev.EventID = ce.eventPrefix + strconv.FormatUint(ce.ids.Add(1), 10)
	msg, _ := json.Marshal(ev)
	return sendText(dc, msg)
}

// isClientClear reports whether a data-channel message is the client's
// {"type":"output_audio_buffer.clear"}.
func isClientClear(data []byte) bool {
	if !bytes.Contains(data, []byte(clientClearType)) {
		return false
	}
	var m struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(data, &m) == nil && m.Type == clientClearType
}
