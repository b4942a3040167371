package peer

import (
	"bytes"
	"testing"
	"time"
)

// TestFeedHoldsEarlyApplicationData: application data that comes before
// the end of the handshake waits, but the handshake records behind it
// (here a retransmitted flight: ChangeCipherSpec, then a Finished) are
// read past it; once the handshake has ended the held data comes, in
// order. Before, the first early datagram blocked the queue's head, and
// a handshake whose Finished was lost and came again after the peer's
// first SCTP packets never ended.
func TestFeedHoldsEarlyApplicationData(t *testing.T) {
	f := newFeed(&Session{})
	defer f.Close()
	app1 := []byte{contentApplicationData, 0xfe, 0xfd, 1}
	app2 := []byte{contentApplicationData, 0xfe, 0xfd, 2}
	ccs := []byte{20, 0xfe, 0xfd, 3}
	fin := []byte{22, 0xfe, 0xfd, 4}
	for _, b := range [][]byte{app1, app2, ccs, fin} {
		if !f.push(b) {
			t.Fatal("push refused")
		}
	}
	buf := make([]byte, 64)
	read := func() []byte {
		t.Helper()
		_ = f.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := f.ReadFrom(buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return bytes.Clone(buf[:n])
	}
	for _, want := range [][]byte{ccs, fin} {
		if got := read(); !bytes.Equal(got, want) {
			t.Fatalf("before the end of the handshake: read %v, want %v", got, want)
		}
	}
	// Nothing else may come before the handshake ends.
	_ = f.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _, err := f.ReadFrom(buf); err == nil {
		t.Fatalf("read %v before the end of the handshake", buf[:n])
	}
	done := make(chan []byte, 2)
	go func() {
		for range 2 {
			_ = f.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := f.ReadFrom(buf)
			if err != nil {
				close(done)
				return
			}
			done <- bytes.Clone(buf[:n])
		}
	}()
	f.handshaken() // wakes the blocked read
	for _, want := range [][]byte{app1, app2} {
		if got := <-done; !bytes.Equal(got, want) {
			t.Fatalf("after the handshake: read %v, want %v", got, want)
		}
	}
}
