// Package bridgetest holds backend sides of the bridge protocol
// (docs/bridge.md) for tests and benchmarks.
package bridgetest

import (
	"context"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// Echo serves one bridge session as an echo backend, as internal/agent's
// echo does without its logging and counts: each audio frame and event
// goes back as it came, and the transceiver's end is answered with the
// same reason. onAudio, if not nil, sees each audio frame before it is
// echoed. Echo returns when the session ends, a read fails, or a send
// fails; it does not close sc.
func Echo(ctx context.Context, sc *bridge.ServerConn, onAudio func(*bridge.AudioFrame)) {
	for {
		m, err := sc.Recv(ctx)
		if err != nil {
			return
		}
		switch {
		case m.Audio != nil:
			if onAudio != nil {
				onAudio(m.Audio)
			}
			if sc.SendAudio(ctx, *m.Audio) != nil {
				return
			}
		case m.Event != nil:
			if sc.SendEvent(ctx, m.Event) != nil {
				return
			}
		case m.End != nil:
			_ = sc.End(ctx, m.End.Reason)
			return
		}
	}
}
