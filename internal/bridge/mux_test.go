package bridge_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/bridgetest"
)

// echoSession echoes one session's audio and events until it ends, as
// internal/agent's echo does.
func echoSession(sc *bridge.ServerConn) { bridgetest.Echo(context.Background(), sc, nil) }

// serveV2 serves the bridge with Serve (v1 and v2), each session handled
// by session; it returns the URL and the connections' stats.
func serveV2(t testing.TB, session func(*bridge.ServerConn)) (string, *bridge.MuxStats) {
	stats := new(bridge.MuxStats)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{Stats: stats}, session)
	}))
	return url, stats
}

func newPool(t *testing.T, url string, perConn int) *bridge.Pool {
	p := bridge.NewPool(url, bridge.PoolOptions{SessionsPerConn: perConn})
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func poolDial(t *testing.T, p *bridge.Pool, id string) *bridge.Conn {
	t.Helper()
	c, err := p.Dial(testCtx(t), bridge.SessionStart{SessionID: id})
	if err != nil {
		t.Fatalf("Pool.Dial %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchange sends n frames and one event on c and checks that they come
// back in order, unchanged.
func exchange(ctx context.Context, c *bridge.Conn, tag string, n int) error {
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			p := fmt.Appendf(nil, "%s/%d", tag, i)
			if err := c.SendAudio(ctx, bridge.AudioFrame{Seq: uint16(i), Timestamp: uint32(i * 960), Payload: p}); err != nil {
				errc <- err
				return
			}
		}
		errc <- c.SendEvent(ctx, []byte(tag+"/done"))
	}()
	for i := range n {
		m, err := c.Recv(ctx)
		if err != nil {
			return fmt.Errorf("%s: frame %d: %w", tag, i, err)
		}
		if m.Audio == nil {
			return fmt.Errorf("%s: frame %d: got %+v", tag, i, m)
		}
		if want := fmt.Sprintf("%s/%d", tag, i); m.Audio.Seq != uint16(i) || m.Audio.Timestamp != uint32(i*960) || string(m.Audio.Payload) != want {
			return fmt.Errorf("%s: got frame seq %d ts %d %q, want seq %d %q", tag, m.Audio.Seq, m.Audio.Timestamp, m.Audio.Payload, i, want)
		}
	}
	m, err := c.Recv(ctx)
	if err != nil || string(m.Event) != tag+"/done" {
		return fmt.Errorf("%s: want event %q, got %+v, %v", tag, tag+"/done", m, err)
	}
	return <-errc
}

func TestPoolV1Backend(t *testing.T) {
	url := echoURLV1(t)
	p := newPool(t, url, 4)
	ctx := testCtx(t)
	var cs []*bridge.Conn
	for i := range 3 {
		c := poolDial(t, p, fmt.Sprint("v1-", i))
		if err := exchange(ctx, c, fmt.Sprint("v1-", i), 20); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Pool.Conns() = %d v2 connections to a v1 backend, want 0", n)
	}
	for _, c := range cs {
		if err := c.End(ctx, bridge.ReasonClientHangup); err != nil {
			t.Errorf("End: %v", err)
		}
	}
}

// echoURLV1 serves an echo through Accept, which speaks only v1.
func echoURLV1(t testing.TB) string {
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
		if err != nil {
			return
		}
		defer sc.Close()
		echoSession(sc)
	}))
}

func TestV2ManySessions(t *testing.T) {
	url, stats := serveV2(t, echoSession)
	p := newPool(t, url, 16)
	ctx := testCtx(t)
	const sessions, frames = 60, 200
	cs := make([]*bridge.Conn, sessions)
	for i := range cs {
		cs[i] = poolDial(t, p, fmt.Sprint("s", i))
	}
	if got, want := p.Conns(), (sessions+15)/16; got != want {
		t.Errorf("Pool.Conns() = %d with %d sessions at 16 per connection, want %d", got, sessions, want)
	}
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for i, c := range cs {
		wg.Go(func() { errs <- exchange(ctx, c, fmt.Sprint("s", i), frames) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	// Coalescing: fewer WebSocket messages than records, both ways.
	if w, r := p.Stats().Batches(), p.Stats().Records(); w == 0 || w > r {
		t.Errorf("transceiver side wrote %d batches for %d records", w, r)
	}
	t.Logf("transceiver: %d records in %d batches; backend: %d records in %d batches",
		p.Stats().Records(), p.Stats().Batches(), stats.Records(), stats.Batches())
	for _, c := range cs {
		if err := c.End(ctx, bridge.ReasonClientHangup); err != nil {
			t.Errorf("End: %v", err)
		}
	}
	for _, r := range bridge.DropReasons() {
		if r == bridge.DropClosedSession {
			continue
		}
		if n := p.Stats().Drops(r) + stats.Drops(r); n != 0 {
			t.Errorf("%d drops for %v", n, r)
		}
	}
}

func TestV2EndOneSession(t *testing.T) {
	ended := make(chan string, 4)
	url, _ := serveV2(t, func(sc *bridge.ServerConn) {
		if sc.Session().SessionID == "quits" {
			_ = sc.End(context.Background(), bridge.ReasonDone)
			ended <- "quits"
			return
		}
		echoSession(sc)
		ended <- sc.Session().SessionID
	})
	p := newPool(t, url, 8)
	ctx := testCtx(t)
	a := poolDial(t, p, "a")
	q := poolDial(t, p, "quits")
	b := poolDial(t, p, "b")
	m, err := q.Recv(ctx)
	if err != nil || m.End == nil || m.End.Reason != bridge.ReasonDone {
		t.Fatalf("quits: Recv = %+v, %v; want session.end done", m, err)
	}
	_ = q.End(ctx, "")
	if _, err := q.Recv(ctx); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("quits: Recv after the end = %v, want ErrClosed", err)
	}
	if err := q.SendAudio(ctx, bridge.AudioFrame{}); !errors.Is(err, bridge.ErrClosed) {
		t.Errorf("quits: SendAudio after the end = %v, want ErrClosed", err)
	}
	for _, c := range []*bridge.Conn{a, b} {
		if err := exchange(ctx, c, "after", 50); err != nil {
			t.Error(err)
		}
	}
	// A's end does not end b either.
	if err := a.End(ctx, bridge.ReasonClientHangup); err != nil {
		t.Fatal(err)
	}
	if err := exchange(ctx, b, "b-after-a", 50); err != nil {
		t.Error(err)
	}
	if err := b.End(ctx, bridge.ReasonClientHangup); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 3 {
		got[<-ended] = true
	}
	if !got["a"] || !got["b"] || !got["quits"] {
		t.Errorf("backend sessions that ended: %v, want a, b and quits", got)
	}
}

// connTracker records the server side of every hijacked connection.
type connTracker struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (ct *connTracker) closeAll() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, c := range ct.conns {
		_ = c.Close()
	}
}

func TestV2ConnectionLoss(t *testing.T) {
	ct := new(connTracker)
	var wg sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wg.Add(1)
		defer wg.Done()
		_ = bridge.Serve(w, r, bridge.AcceptOptions{}, echoSession)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateHijacked {
			ct.mu.Lock()
			ct.conns = append(ct.conns, c)
			ct.mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	url := "ws" + srv.URL[len("http"):]
	p := newPool(t, url, 4)
	ctx := testCtx(t)
	cs := make([]*bridge.Conn, 10)
	for i := range cs {
		cs[i] = poolDial(t, p, fmt.Sprint("s", i))
		if err := exchange(ctx, cs[i], "before", 5); err != nil {
			t.Fatal(err)
		}
	}
	ct.closeAll() // the backend's process dies
	for i, c := range cs {
		m, err := c.Recv(ctx)
		if !errors.Is(err, bridge.ErrClosed) {
			t.Errorf("session %d: Recv after the connection dropped = %+v, %v; want ErrClosed", i, m, err)
		}
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Pool.Conns() = %d after the drop, want 0", n)
	}
	// New sessions get a new connection.
	c := poolDial(t, p, "after")
	if err := exchange(ctx, c, "after", 5); err != nil {
		t.Error(err)
	}
	_ = c.End(ctx, bridge.ReasonClientHangup)
}

func TestV2StalledSessionQueue(t *testing.T) {
	// The backend sends the stalled session more than its queue holds;
	// the other session on the connection keeps flowing, the stalled
	// one is ended with CloseQueueFull.
	stalledErr := make(chan error, 1)
	url, _ := serveV2(t, func(sc *bridge.ServerConn) {
		if sc.Session().SessionID != "stalled" {
			echoSession(sc)
			return
		}
		big := make([]byte, 900<<10)
		ctx := context.Background()
		for range 2 * bridge.SessionQueueLimit / len(big) {
			if err := sc.SendAudio(ctx, bridge.AudioFrame{Payload: big}); err != nil {
				break
			}
		}
		_, err := sc.Recv(ctx)
		stalledErr <- err
	})
	p := newPool(t, url, 8)
	ctx := testCtx(t)
	stalled := poolDial(t, p, "stalled")
	live := poolDial(t, p, "live")
	if err := exchange(ctx, live, "live", 100); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-stalledErr:
	case <-ctx.Done():
		t.Fatal("the backend's stalled session did not end")
	}
	if websocket.CloseStatus(err) != bridge.CloseQueueFull {
		t.Errorf("backend: stalled session ended with %v, want close code %d", err, bridge.CloseQueueFull)
	}
	if n := p.Stats().Drops(bridge.DropQueueFull); n != 1 {
		t.Errorf("DropQueueFull = %d, want 1", n)
	}
	if err := exchange(ctx, live, "live-after", 100); err != nil {
		t.Fatal(err)
	}
	// The stalled session's reader gets what was queued, then the end.
	for {
		m, err := stalled.Recv(ctx)
		if err != nil {
			if !errors.Is(err, bridge.ErrClosed) {
				t.Errorf("stalled: %v, want ErrClosed", err)
			}
			break
		}
		if m.Audio == nil {
			t.Fatalf("stalled: got %+v", m)
		}
	}
	_ = live.End(ctx, bridge.ReasonClientHangup)
}

// rawV2 dials url as a v2 transceiver by hand and does the connection
// hello.
func rawV2(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx := testCtx(t)
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{bridge.SubprotocolV2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	if err := ws.Write(ctx, websocket.MessageBinary, bridge.AppendRecord(nil, 0, bridge.RecordText, []byte(`{"type":"hello","version":2}`))); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, err := bridge.ParseRecord(b); err != nil || r.Session != 0 || !bytes.Contains(r.Payload, []byte(`"version":2`)) {
		t.Fatalf("connection hello answer %q: %+v, %v", b, r, err)
	}
	return ws
}

func TestV2MalformedRecords(t *testing.T) {
	url, stats := serveV2(t, echoSession)
	ws := rawV2(t, url)
	ctx := testCtx(t)
	hello := []byte(`{"type":"hello","version":1,"audio_formats":["opus/48000/2"]}`)
	start := []byte(`{"type":"session.start","session_id":"raw"}`)
	frame := bridge.AppendAudioFrame(nil, bridge.AudioFrame{Seq: 7, Timestamp: 9, Payload: []byte("opus")})
	send := func(b []byte) {
		t.Helper()
		if err := ws.Write(ctx, websocket.MessageBinary, b); err != nil {
			t.Fatal(err)
		}
	}
	send(bridge.AppendRecord(nil, 1, bridge.RecordText, hello))
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, err := bridge.ParseRecord(b); err != nil || r.Session != 1 || !bytes.Contains(r.Payload, []byte(`"audio_format":"opus/48000/2"`)) {
		t.Fatalf("session hello answer %q: %+v, %v", b, r, err)
	}
	send(bridge.AppendRecord(nil, 1, bridge.RecordText, start))
	// One batch: a record of an unknown kind (skipped), a record for
	// session 0 after the hello (dropped), a valid frame, then a record
	// whose length runs past the end.
	var batch []byte
	batch = bridge.AppendRecord(batch, 1, 0x7f, []byte("later kind"))
	batch = bridge.AppendRecord(batch, 0, bridge.RecordText, []byte(`{"type":"hello","version":2}`))
	batch = bridge.AppendRecord(batch, 1, bridge.RecordBinary, frame)
	batch = append(batch, 0x01, bridge.RecordBinary, 0x50, 0x01)
	send(batch)
	send([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // overlong varint
	_ = ws.Write(ctx, websocket.MessageText, []byte("not a batch"))
	// The echo of the valid frame comes back.
	_, b, err = ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := bridge.ParseRecord(b)
	if err != nil || r.Session != 1 || r.Kind != bridge.RecordBinary {
		t.Fatalf("echo %q: %+v, %v", b, r, err)
	}
	if f, err := bridge.ParseAudioFrame(r.Payload); err != nil || f.Seq != 7 || string(f.Payload) != "opus" {
		t.Fatalf("echoed frame %+v, %v", f, err)
	}
	// The counters: text_message is counted after the read of the echo,
	// so end with a round trip that follows it.
	send(bridge.AppendRecord(nil, 1, bridge.RecordText, []byte(`{"type":"event","data":"sync"}`)))
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	for reason, want := range map[bridge.DropReason]uint64{bridge.DropUnknownKind: 1, bridge.DropUnknownSession: 1, bridge.DropMalformed: 2, bridge.DropTextMessage: 1} {
		if got := stats.Drops(reason); got != want {
			t.Errorf("Drops(%v) = %d, want %d", reason, got, want)
		}
	}
	send(bridge.AppendRecord(bridge.AppendRecord(nil, 1, bridge.RecordText, []byte(`{"type":"session.end","reason":"client_hangup"}`)),
		1, bridge.RecordClose, []byte{0x03, 0xe8}))
	_ = ws.Close(websocket.StatusNormalClosure, "")
}

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		session uint64
		kind    byte
		payload []byte
	}{
		{"empty", 1, bridge.RecordText, nil},
		{"audio", 300, bridge.RecordBinary, bytes.Repeat([]byte{1}, 200)},
		{"max index", 1<<64 - 1, bridge.RecordClose, []byte{0x03, 0xe8}},
		{"largest", 7, bridge.RecordBinary, make([]byte, bridge.MaxMessageSize)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bridge.AppendRecord([]byte("x"), tc.session, tc.kind, tc.payload)[1:]
			b = append(b, "rest"...)
			r, rest, err := bridge.ParseRecord(b)
			if err != nil || r.Session != tc.session || r.Kind != tc.kind || !bytes.Equal(r.Payload, tc.payload) || string(rest) != "rest" {
				t.Errorf("ParseRecord = %d %d %d bytes, rest %q, %v", r.Session, r.Kind, len(r.Payload), rest, err)
			}
		})
	}
	tooBig := binary.AppendUvarint([]byte{1, bridge.RecordBinary}, bridge.MaxMessageSize+1)
	tooBig = append(tooBig, make([]byte, bridge.MaxMessageSize+1)...)
	if _, _, err := bridge.ParseRecord(tooBig); !errors.Is(err, bridge.ErrRecord) {
		t.Errorf("record over MaxMessageSize: %v, want ErrRecord", err)
	}
}

func TestRecordAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	payload := make([]byte, 100)
	if n := testing.AllocsPerRun(100, func() {
		b := bridge.AppendRecord(buf[:0], 12345, bridge.RecordBinary, payload)
		if _, _, err := bridge.ParseRecord(b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AppendRecord + ParseRecord: %v allocations, want 0", n)
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add(bridge.AppendRecord(nil, 1, bridge.RecordBinary, []byte("abc")))
	f.Add(bridge.AppendRecord(bridge.AppendRecord(nil, 0, bridge.RecordText, []byte(`{"type":"hello","version":2}`)), 3, bridge.RecordClose, []byte{3, 232}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{1, 1, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		rest := b
		for len(rest) > 0 {
			r, next, err := bridge.ParseRecord(rest)
			if err != nil {
				if !errors.Is(err, bridge.ErrRecord) {
					t.Fatalf("error %v does not wrap ErrRecord", err)
				}
				return
			}
			if len(next) >= len(rest) {
				t.Fatalf("ParseRecord did not advance")
			}
			// Round trip: re-encoding gives the same record.
			enc := bridge.AppendRecord(nil, r.Session, r.Kind, r.Payload)
			r2, tail, err := bridge.ParseRecord(enc)
			if err != nil || len(tail) != 0 || r2.Session != r.Session || r2.Kind != r.Kind || !bytes.Equal(r2.Payload, r.Payload) {
				t.Fatalf("round trip of %+v: %+v, %q, %v", r, r2, tail, err)
			}
			rest = next
		}
	})
}

func TestV2SessionHandshakeError(t *testing.T) {
	// A session whose hello has another version fails alone (a close
	// record with 4001 for its index, HandshakeError called); the
	// connection's next session and the sessions of other connections
	// go on.
	failed := make(chan error, 200)
	stats := new(bridge.MuxStats)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = bridge.Serve(w, r, bridge.AcceptOptions{HandshakeError: func(err error) { failed <- err }, Stats: stats}, echoSession)
	}))
	p := newPool(t, url, 8)
	ctx := testCtx(t)
	a := poolDial(t, p, "a")
	ws := rawV2(t, url)
	if err := ws.Write(ctx, websocket.MessageBinary, bridge.AppendRecord(nil, 1, bridge.RecordText, []byte(`{"type":"hello","version":7,"audio_formats":["opus/48000/2"]}`))); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := bridge.ParseRecord(b)
	if err != nil || r.Session != 1 || r.Kind != bridge.RecordClose || len(r.Payload) < 2 || binary.BigEndian.Uint16(r.Payload) != bridge.CloseVersion {
		t.Fatalf("answer to a v7 session hello: %+v, %v; want a close record with %d", r, err, bridge.CloseVersion)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, bridge.ErrVersion) {
			t.Errorf("HandshakeError got %v, want ErrVersion", err)
		}
	case <-ctx.Done():
		t.Fatal("HandshakeError not called")
	}
	// The raw connection's next session works.
	if err := ws.Write(ctx, websocket.MessageBinary, bridge.AppendRecord(nil, 2, bridge.RecordText, []byte(`{"type":"hello","version":1,"audio_formats":["opus/48000/2"]}`))); err != nil {
		t.Fatal(err)
	}
	if _, b, err = ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _, err := bridge.ParseRecord(b); err != nil || r.Session != 2 || r.Kind != bridge.RecordText {
		t.Fatalf("answer to session 2's hello: %+v, %v", r, err)
	}
	// More bad hellos on the same connection, one record each, are
	// counted, not reported (a caller logs in HandshakeError): one batch
	// of 100 sessions with bad hellos, then a good session to sync on.
	var batch []byte
	for i := range 100 {
		batch = bridge.AppendRecord(batch, uint64(3+i), bridge.RecordText, []byte(`{"type":"hello","version":7}`))
	}
	batch = bridge.AppendRecord(batch, 103, bridge.RecordText, []byte(`{"type":"hello","version":1,"audio_formats":["opus/48000/2"]}`))
	if err := ws.Write(ctx, websocket.MessageBinary, batch); err != nil {
		t.Fatal(err)
	}
	for closes := 0; closes < 100; {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for len(b) > 0 {
			r, rest, err := bridge.ParseRecord(b)
			if err != nil {
				t.Fatal(err)
			}
			b = rest
			if r.Kind == bridge.RecordClose {
				closes++
			}
		}
	}
	// Each session's goroutine counts its failure as it ends; wait for
	// the count, bounded by ctx.
	for stats.SetupFailures() < 101 {
		select {
		case <-ctx.Done():
			t.Fatalf("SetupFailures() = %d, want 101", stats.SetupFailures())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if n := stats.SetupFailures(); n != 101 {
		t.Errorf("SetupFailures() = %d, want 101", n)
	}
	select {
	case err := <-failed:
		t.Errorf("HandshakeError called again on the same connection: %v", err)
	default:
	}
	_ = ws.Close(websocket.StatusNormalClosure, "")
	if err := exchange(ctx, a, "a", 20); err != nil {
		t.Error(err)
	}
	_ = a.End(ctx, bridge.ReasonClientHangup)
}

func TestV2ConcurrentOpens(t *testing.T) {
	// Sessions opened at once on one connection: their first records
	// interleave in any order, and each must still reach the backend as
	// a new session (indexes are given in the order records are queued).
	url, stats := serveV2(t, echoSession)
	p := newPool(t, url, 128)
	ctx := testCtx(t)
	if err := exchange(ctx, poolDial(t, p, "first"), "first", 1); err != nil { // the connection is up
		t.Fatal(err)
	}
	const n = 100
	cs := make([]*bridge.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { cs[i], errs[i] = p.Dial(ctx, bridge.SessionStart{SessionID: fmt.Sprint("c", i)}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		t.Cleanup(func() { _ = cs[i].Close() })
	}
	if got := p.Conns(); got != 1 {
		t.Errorf("%d connections, want 1", got)
	}
	for i, c := range cs {
		if err := exchange(ctx, c, fmt.Sprint("c", i), 3); err != nil {
			t.Error(err)
		}
	}
	if d := stats.Drops(bridge.DropClosedSession) + stats.Drops(bridge.DropUnknownSession); d != 0 {
		t.Errorf("backend dropped %d records for closed or unknown sessions", d)
	}
}
