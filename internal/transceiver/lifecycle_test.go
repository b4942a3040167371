package transceiver

import (
	"context"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/bridge"
)

// TestDeleteDoesNotWaitForEnd: DELETE answers once the session has left
// the table, without waiting for its end (the backend's close handshake,
// the SCTP acknowledgement of the goodbye event); Close waits for that end.
func TestDeleteDoesNotWaitForEnd(t *testing.T) {
	gotEnd, release := make(chan struct{}), make(chan struct{})
	url := backendFunc(t, func(sc *bridge.ServerConn) {
		defer sc.Close()
		for {
			m, err := sc.Recv(t.Context())
			if err != nil {
				return
			}
			if m.End != nil {
				close(gotEnd)
				<-release // hold the close handshake until the test lets go
				return
			}
		}
	})
	s, api := directServer(t, func(c *Config) { c.BackendURL = url })
	c := dialLive(t, api, nil)
	waitFor(t, c.dcOpen, 10*time.Second, "the client's data channel")

	req, _ := http.NewRequest(http.MethodDelete, c.session, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	// The backend has not finished its close handshake, so the session's
	// end cannot have finished: DELETE did not wait for it.
	ended := s.metrics.sessionsEnded.WithLabelValues(bridge.ReasonClientHangup)
	if n := testutil.ToFloat64(ended); n != 0 {
		t.Fatalf("the session's end finished before DELETE returned (%v ended), so DELETE waited for the backend", n)
	}
	if s.Sessions() != 0 {
		t.Fatal("the session is still in the table after DELETE")
	}
	waitFor(t, gotEnd, 10*time.Second, "the backend's session.end")

	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a session's end was still in flight")
	case <-time.After(100 * time.Millisecond): // Close would be done by now if it did not wait
	}
	close(release)
	<-closed
	if n := testutil.ToFloat64(ended); n != 1 {
		t.Fatalf("%v sessions ended client_hangup after Close, want 1", n)
	}
}

// TestDeleteLatency measures, for connected calls with an open data
// channel and the echo backend, how long DELETE takes to answer and how
// long the session's end takes (what DELETE waited for before it answered
// early: the backend's close handshake and the goodbye event's SCTP
// acknowledgement). Medians of 10. Run with SWITCHBOARD_MEASURE=1.
func TestDeleteLatency(t *testing.T) {
	if os.Getenv("SWITCHBOARD_MEASURE") == "" {
		t.Skip("set SWITCHBOARD_MEASURE=1 to measure")
	}
	s, api := directServer(t)
	var answered, ended []time.Duration
	for range 10 {
		c := dialLive(t, api, nil)
		waitFor(t, c.dcOpen, 10*time.Second, "the client's data channel")
		time.Sleep(100 * time.Millisecond)
		req, _ := http.NewRequest(http.MethodDelete, c.session, nil)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		answered = append(answered, time.Since(start))
		s.ends.Wait()
		ended = append(ended, time.Since(start))
		_ = c.pc.Close()
	}
	slices.Sort(answered)
	slices.Sort(ended)
	t.Logf("DELETE answered in %v (median of 10; max %v); the session's end took %v (median; max %v)",
		answered[5].Round(10*time.Microsecond), answered[9].Round(10*time.Microsecond), ended[5].Round(time.Millisecond), ended[9].Round(time.Millisecond))
}

// TestDrain: Drain refuses offers, returns 0 once the last session ends
// (woken by the end, no polling) and otherwise ends what is left when its
// context ends, returning how many.
func TestDrain(t *testing.T) {
	t.Run("sessions end", func(t *testing.T) {
		s, api := directServer(t)
		c := dialLive(t, api, nil)
		waitFor(t, c.connected, 10*time.Second, "the client's connection")
		done := make(chan int, 1)
		go func() { done <- s.Drain(t.Context()) }()
		for s.Ready() {
			time.Sleep(time.Millisecond)
		}
		if code, _ := offerFrom(t, api, "", clientOffer(t, true)); code != http.StatusServiceUnavailable {
			t.Fatalf("offer while draining: %d, want 503", code)
		}
		req, _ := http.NewRequest(http.MethodDelete, c.session, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if n := <-done; n != 0 {
			t.Fatalf("Drain ended %d sessions, want 0", n)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		s, api := directServer(t)
		c := dialLive(t, api, nil)
		waitFor(t, c.connected, 10*time.Second, "the client's connection")
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if n := s.Drain(ctx); n != 1 {
			t.Fatalf("Drain ended %d sessions, want 1", n)
		}
		if s.Sessions() != 0 {
			t.Fatal("a session outlived Drain")
		}
	})
}
