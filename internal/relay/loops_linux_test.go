package relay

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPersistentReadError puts /dev/null in place of worker 0's public
// socket (dup3 onto its descriptor), so that every read fails (ENOTSOCK).
// The loop must back off instead of spinning, stop once the errors have
// lasted the limit, and make the relay not ready; Close still works.
func TestPersistentReadError(t *testing.T) {
	for _, tt := range []struct {
		name  string
		batch int
	}{{"batched", 0}, {"batch=1", 1}} {
		t.Run(tt.name, func(t *testing.T) {
			const limit = 300 * time.Millisecond
			tune := defaultTuning
			tune.readErrorLimit = limit
			e := newTunedEnv(t, Config{Workers: 1, Batch: tt.batch}, nil, tune)
			if err := e.r.Ready(); err != nil {
				t.Fatalf("a new relay is not ready: %v", err)
			}
			null, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer null.Close()
			rc, err := e.r.workers[0].public.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var derr error
			if err := rc.Control(func(fd uintptr) { derr = unix.Dup3(int(null.Fd()), int(fd), unix.O_CLOEXEC) }); err != nil || derr != nil {
				t.Fatal(err, derr)
			}
			// Wake the loop if it is parked in the netpoller: its socket
			// is gone, so a datagram cannot; a read deadline can.
			_ = e.r.workers[0].public.SetReadDeadline(time.Now())
			eventually(t, "the relay to report the stopped loop", func() bool { return e.r.Ready() != nil })
			if err := e.r.Ready(); !strings.Contains(err.Error(), "public read loop stopped") {
				t.Errorf("Ready: %v", err)
			}
			// Waits of 1, 2, 4 … ms until the limit: about log2(limit/1ms)
			// errors, whatever the machine's speed (waits are minimums).
			if n := e.r.Stats().Drops[DropReadError]; n == 0 || n > 12 {
				t.Errorf("%d read errors counted before stopping, want 1 to 12 (backing off, not spinning)", n)
			}
		})
	}
}
