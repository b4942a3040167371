package bridge_test

import (
	"net/http"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// TestConnectionState: connection messages reach the backend in order,
// between the session's other messages.
func TestConnectionState(t *testing.T) {
	got := make(chan []string, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, err := bridge.Accept(w, r, bridge.AcceptOptions{})
		if err != nil {
			got <- nil
			return
		}
		defer sc.Close()
		var seen []string
		for {
			m, err := sc.Recv(testCtx(t))
			switch {
			case err != nil:
				got <- append(seen, "error")
				return
			case m.Connection != nil:
				seen = append(seen, m.Connection.State)
			case m.Event != nil:
				seen = append(seen, "event:"+string(m.Event))
			case m.End != nil:
				got <- append(seen, "end:"+m.End.Reason)
				return
			}
		}
	}))
	c := dial(t, url)
	ctx := testCtx(t)
	if err := c.SendConnectionState(ctx, bridge.StateDisconnected); err != nil {
		t.Fatal(err)
	}
	if err := c.SendEvent(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.SendConnectionState(ctx, bridge.StateConnected); err != nil {
		t.Fatal(err)
	}
	if err := c.SendConnectionState(ctx, ""); err == nil {
		t.Fatal("an empty state was sent")
	}
	if err := c.End(ctx, bridge.ReasonICEFailed); err != nil {
		t.Fatal(err)
	}
	want := []string{"disconnected", "event:x", "connected", "end:ice_failed"}
	if s := <-got; len(s) != len(want) || s[0] != want[0] || s[1] != want[1] || s[2] != want[2] || s[3] != want[3] {
		t.Fatalf("backend saw %q, want %q", s, want)
	}
}
