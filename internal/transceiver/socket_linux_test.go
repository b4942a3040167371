package transceiver

import (
	"crypto/rand"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/udpio"
)

// TestSocketBuffers checks that the transceiver's one UDP socket asks for
// udpio.BufferSize (as far as net.core.rmem_max allows) and that its
// kernel drops are exported from the start.
func TestSocketBuffers(t *testing.T) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys, err := token.NewKeyring(token.Key{ID: 1, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{ID: 1, ListenAddr: "127.0.0.1:0", Advertise: "127.0.0.1:3478", BackendURL: "ws://127.0.0.1:1/v1/bridge"},
		keys, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	want := udpio.BufferSize
	if b, err := os.ReadFile("/proc/sys/net/core/rmem_max"); err == nil {
		if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			want = min(want, max)
		}
	}
	rc, err := s.sock.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if got < want { // Linux reports twice what it granted
		t.Errorf("SO_RCVBUF %d bytes, want at least %d", got, want)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "switchboard_transceiver_socket_dropped_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 0 {
				t.Errorf("%s = %v on an idle socket", mf.GetName(), v)
			}
			return
		}
	}
	t.Error("switchboard_transceiver_socket_dropped_total is not exported")
}
