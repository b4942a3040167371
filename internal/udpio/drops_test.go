package udpio

import (
	"errors"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestDrops overflows a socket's receive buffer on purpose: every
// datagram sent is either read or counted by Drops.
func TestDrops(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	d0, err := Drops(rx)
	if runtime.GOOS != "linux" {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Drops on %s: %v, want errors.ErrUnsupported", runtime.GOOS, err)
		}
		t.Skip("no socket drop count on " + runtime.GOOS)
	}
	if err != nil || d0 != 0 {
		t.Fatalf("Drops of a new socket = %d, %v; want 0, nil", d0, err)
	}
	if err := rx.SetReadBuffer(4096); err != nil { // the kernel's floor: a few datagrams
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	const sent = 200
	payload := make([]byte, 100)
	for range sent {
		if _, err := tx.Write(payload); err != nil {
			t.Fatal(err)
		}
	}
	read := 0
	buf := make([]byte, 1500)
	for {
		_ = rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := rx.Read(buf); err != nil {
			break
		}
		read++
	}
	drops, err := Drops(rx)
	if err != nil {
		t.Fatal(err)
	}
	if read == sent || drops == 0 {
		t.Fatalf("read %d of %d datagrams, %d dropped: the buffer did not overflow", read, sent, drops)
	}
	if read+int(drops) != sent {
		t.Errorf("read %d + dropped %d = %d, want the %d sent", read, drops, read+int(drops), sent)
	}
}
