package transceiver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestDataChannelMessages sends oai-events messages of a few bytes and of
// many times the first read buffer (eventsReadSize) through a direct-mode
// transceiver to the echo agent and back, while a second, ignored channel
// carries traffic too: each comes back whole and in order, so the
// detached read loop grows its buffer to the message.
func TestDataChannelMessages(t *testing.T) {
	_, api, _ := newTestServer(t, func(c *Config) { c.Direct, c.Advertise = true, "" })
	pc, events := eventsClient(t)
	other, err := pc.CreateDataChannel("other", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 16)
	events.OnMessage(func(m webrtc.DataChannelMessage) { got <- string(m.Data) })
	opened := make(chan struct{}, 2)
	events.OnOpen(func() { opened <- struct{}{} })
	other.OnOpen(func() { opened <- struct{}{} })

	offerCall(t, api.URL, pc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 2 {
		select {
		case <-opened:
		case <-ctx.Done():
			t.Fatal("data channels did not open")
		}
	}
	flood := bytes.Repeat([]byte{'x'}, 16<<10)
	for range 128 {
		if err := other.Send(flood); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`{"type":"ping","id":"small"}`,
		fmt.Sprintf(`{"type":"big","pad":"%s"}`, strings.Repeat("y", 5*eventsReadSize)),
		fmt.Sprintf(`{"type":"bigger","pad":"%s"}`, strings.Repeat("z", 30<<10)),
		`{"type":"ping","id":"after"}`,
	}
	for _, m := range want {
		if err := events.SendText(m); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range want {
		select {
		case g := <-got:
			if g != w {
				t.Fatalf("message %d: got %d bytes %.40q, want %d bytes %.40q", i, len(g), g, len(w), w)
			}
		case <-ctx.Done():
			t.Fatalf("message %d (%d bytes) did not come back", i, len(w))
		}
	}
}

// TestDataChannelLimit: a client that opens more data channels than
// maxDataChannels gets the extra ones closed at once, each counted, with
// one log line for the session; oai-events, whenever it opens among
// them, still works.
func TestDataChannelLimit(t *testing.T) {
	var logs logbuf.Buffer
	s, api, _ := newTestServerLog(t, slog.New(slog.NewTextHandler(&logs, nil)), func(c *Config) { c.Direct, c.Advertise = true, "" })
	pc, events := eventsClient(t)
	got := make(chan string, 4)
	events.OnMessage(func(m webrtc.DataChannelMessage) { got <- string(m.Data) })
	opened := make(chan struct{}, 1)
	events.OnOpen(func() { opened <- struct{}{} })
	const extra = maxDataChannels + 3
	for i := range extra {
		if _, err := pc.CreateDataChannel(fmt.Sprintf("extra-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	offerCall(t, api.URL, pc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	select {
	case <-opened:
	case <-ctx.Done():
		t.Fatal("oai-events did not open")
	}
	refused := extra + 1 - maxDataChannels
	for testutil.ToFloat64(s.metrics.dcRefused) < float64(refused) {
		select {
		case <-ctx.Done():
			t.Fatalf("data_channels_refused_total %v, want %d", testutil.ToFloat64(s.metrics.dcRefused), refused)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := events.SendText(`{"type":"ping","id":"x"}`); err != nil {
		t.Fatal(err, logs.String())
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("oai-events message did not come back")
	}
	if n := testutil.ToFloat64(s.metrics.dcRefused); n != float64(refused) {
		t.Fatalf("data_channels_refused_total %v, want %d", n, refused)
	}
	if n := strings.Count(logs.String(), "refusing data channels"); n != 1 {
		t.Fatalf("%d log lines for the refused channels, want 1", n)
	}
}
