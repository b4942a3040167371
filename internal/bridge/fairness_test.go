package bridge_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// TestV2BatchFairness: one session flooding a v2 connection cannot starve
// another session on it. The backend's "flood" session sends audio
// frames as large as a message may be (a whole reply per frame) without
// pause; its "quiet" session sends one small frame at a time, the next
// once the previous one has arrived. The transceiver side, written by
// hand, reads every batch and numbers them as the backend's writer does
// (MuxStats.Batches counts the same messages). Each quiet frame must
// arrive in one of the first three batches the writer starts after the
// send begins: the batch in flight, the pending batch (which the flood
// may have filled: the send waits for it to be taken) and the next one.
// The bound counts batches, not time.
func TestV2BatchFairness(t *testing.T) {
	const (
		quietFrames = 25
		floodFrame  = bridge.MaxMessageSize - bridge.AudioHeaderLen
		maxLag      = 3 // batches, see above
	)
	stats := new(bridge.MuxStats)
	type sent struct {
		seq    uint16
		before uint64 // stats.Batches() when the send began
	}
	sends := make(chan sent, quietFrames)
	arrived := make(chan uint16, quietFrames) // quiet frames seen by the transceiver, in order
	done := make(chan struct{})               // the test is over
	defer close(done)
	flooding := make(chan struct{}) // closed when the first flood frame arrived
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{Stats: stats}, func(sc *bridge.ServerConn) {
			ctx := context.Background()
			switch sc.Session().SessionID {
			case "flood":
				f := bridge.AudioFrame{Payload: make([]byte, floodFrame)}
				for i := 0; ; i++ {
					f.Seq = uint16(i)
					if sc.SendAudio(ctx, f) != nil {
						return
					}
				}
			case "quiet":
				select {
				case <-flooding:
				case <-done:
					return
				}
				for i := range quietFrames {
					before := stats.Batches()
					if err := sc.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(i), Payload: []byte("quiet")}); err != nil {
						t.Errorf("quiet frame %d: %v", i, err)
						return
					}
					sends <- sent{uint16(i), before}
					select {
					case <-arrived:
					case <-done:
						return
					}
				}
				_ = sc.End(ctx, bridge.ReasonDone)
			}
		})
	}))
	ws := rawV2(t, url)
	ws.SetReadLimit(bridge.MaxBatchSize)
	// The test reads a few hundred MiB of flood: give a loaded machine
	// time (the bound asserted is in batches, not time).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var open []byte
	for i, id := range []string{"flood", "quiet"} {
		open = bridge.AppendRecord(open, uint64(i+1), bridge.RecordText, []byte(`{"type":"hello","version":1,"audio_formats":["opus/48000/2"]}`))
		open = bridge.AppendRecord(open, uint64(i+1), bridge.RecordText, []byte(`{"type":"session.start","session_id":"`+id+`"}`))
	}
	if err := ws.Write(ctx, websocket.MessageBinary, open); err != nil {
		t.Fatal(err)
	}
	var (
		batches     uint64 // batches read, numbered as the writer counts them
		floodFrames int
		quietSeen   int
		worst       uint64
	)
	for quietSeen < quietFrames {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("after %d batches, %d quiet frames: %v", batches, quietSeen, err)
		}
		batches++
		inBatch := 0 // flood frames in this batch
		for len(b) > 0 {
			r, rest, err := bridge.ParseRecord(b)
			if err != nil {
				t.Fatalf("batch %d: %v", batches, err)
			}
			b = rest
			if r.Kind != bridge.RecordBinary {
				continue
			}
			switch r.Session {
			case 1:
				if floodFrames == 0 {
					close(flooding)
				}
				floodFrames++
				if inBatch++; inBatch > 1 {
					// Each is past SessionBatchShare: one per batch.
					t.Errorf("batch %d: %d flood frames of %d bytes, want 1", batches, inBatch, floodFrame)
				}
			case 2:
				f, err := bridge.ParseAudioFrame(r.Payload)
				if err != nil {
					t.Fatal(err)
				}
				s := <-sends
				if f.Seq != s.seq {
					t.Fatalf("quiet frame %d arrived, %d sent", f.Seq, s.seq)
				}
				lag := batches - s.before
				worst = max(worst, lag)
				if lag > maxLag {
					t.Errorf("quiet frame %d: in batch %d, %d after the send began (batch %d written), want ≤ %d", f.Seq, batches, lag, s.before, maxLag)
				}
				quietSeen++
				arrived <- f.Seq
			}
		}
	}
	t.Logf("%d batches, %d flood frames (%d MiB), %d quiet frames; worst quiet lag %d batches", batches, floodFrames, floodFrames*floodFrame>>20, quietSeen, worst)
	// The flood sender never pauses: from its first frame on it always
	// has one pending, so every quiet frame competed with it.
	if floodFrames < 2 {
		t.Errorf("%d flood frames: the test did not flood", floodFrames)
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
}
