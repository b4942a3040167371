package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/callclient"
)

// runLoad is `switchboard load URL`: many concurrent sessions against a
// deployment (callclient.Load), a progress line on stderr while they run
// and a JSON summary on stdout at the end. It exits non-zero when any
// session failed.
func runLoad(ctx context.Context, args []string, stdout io.Writer) error {
	var (
		opts     callclient.LoadOptions
		audio    string
		interval time.Duration
		jsonl    bool

		connectedJSON bool
	)
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `Usage: switchboard load URL[,URL...] [flags]

Runs -sessions concurrent WebRTC sessions against the signaling URL(s)
(e.g. http://127.0.0.1:8080/v1/calls), started -ramp apart; each streams
20 ms audio packets for -duration, checks its echo and its data channel,
and hangs up. Prints a progress line on stderr and a JSON summary on
stdout: setup time p50/p99, failures by reason, loss and the largest
audio gap p50/p99. Loss and gaps are the round trip when the backend
echoes (switchboard agent -mode echo, or switchboard demo -mode echo;
against the default parrot every session fails); with -echo=false (a
real agent) nothing is checked for an echo and gaps describe the
backend's own audio.

SIGUSR1 marks the moment of a fault you cause (a pod killed, a link cut):
the summary then adds mark_gap_ms, the largest audio gap each live
session saw within 30 s after it. With -vanish, sessions do not stream:
each connects, then drops off the network a random 0 to -vanish later
(sockets closed, nothing said), to check that the servers clean up;
setup times then cover the sessions whose DTLS finished before they
vanished (the others have none).

Flags:`)
		fs.PrintDefaults()
	}
	fs.IntVar(&opts.Sessions, "sessions", 10, "concurrent sessions")
	fs.DurationVar(&opts.Duration, "duration", 30*time.Second, "audio streamed per session")
	fs.DurationVar(&opts.Ramp, "ramp", 50*time.Millisecond, "delay between two session starts")
	fs.StringVar(&opts.Network, "network", "udp", "candidates each session gathers (IPv4): udp, tcp (ICE-TCP only, as from a network that drops UDP) or any")
	fs.StringVar(&audio, "audio", "", "16-bit PCM WAV file every session sends as Opus, looped (default: 60-byte counter payloads, no encoding cost)")
	fs.StringVar(&opts.AuthToken, "token", "", "bearer token for signaling (a client token or an API key)")
	echo := fs.Bool("echo", true, "the backend echoes audio and data-channel messages (switchboard agent -mode echo): check the echo and report loss; false for a real agent")
	fs.DurationVar(&opts.ConnectTimeout, "connect-timeout", 30*time.Second, "bound on signaling, ICE and DTLS per session")
	fs.DurationVar(&interval, "progress", 2*time.Second, "interval of the progress line on stderr (0 = none)")
	fs.BoolVar(&jsonl, "sessions-json", false, "also print each session's result as a JSON line on stdout as it ends")
	fs.BoolVar(&connectedJSON, "connected-json", false, `also print {"event":"connected","i":N,"url_index":N,"session":URL,"setup_ms":X} on stdout as each session connects (url_index: which of the URLs)`)
	fs.DurationVar(&opts.Vanish, "vanish", 0, "instead of streaming, each session vanishes (closes its sockets unannounced) a random 0 to this after ICE connects")
	headerFlag(fs, &opts.Header, `extra "Name: value" header on the POST and the DELETE (repeatable)`)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return fmt.Errorf("want one signaling URL (several: comma separated), got %d arguments, e.g. switchboard load http://127.0.0.1:8080/v1/calls -sessions 10; run 'switchboard load -h' for the flags", len(positional))
	}
	opts.URLs = strings.Split(positional[0], ",")
	opts.NoEcho = !*echo
	if audio != "" {
		w, err := callclient.LoadWAV(audio)
		if err != nil {
			return fmt.Errorf("-audio: %w", err)
		}
		opts.Audio = w
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false) // errors quote SDP and addresses: "<", ">" and "&" as they are
	var encMu sync.Mutex
	if jsonl {
		opts.OnSession = func(r callclient.SessionResult) {
			encMu.Lock()
			defer encMu.Unlock()
			_ = enc.Encode(r)
		}
	}
	if connectedJSON {
		opts.OnConnected = func(r callclient.SessionResult) {
			encMu.Lock()
			defer encMu.Unlock()
			_ = enc.Encode(connectedEvent{Event: "connected", I: r.I, URLIndex: r.URLIndex, Session: r.Session, SetupMS: r.SetupMS})
		}
	}
	l, err := callclient.NewLoad(opts)
	if err != nil {
		return err
	}
	marks := make(chan os.Signal, 1)
	signal.Notify(marks, syscall.SIGUSR1)
	go func() {
		for range marks {
			l.Mark()
		}
	}()
	defer func() {
		signal.Stop(marks) // no send after this returns
		close(marks)
	}()
	var progress io.Writer
	if interval > 0 {
		progress = os.Stderr
	}
	sum := l.Run(ctx, progress, interval)
	encMu.Lock()
	defer encMu.Unlock()
	enc.SetIndent("", "  ")
	if err := enc.Encode(sum); err != nil {
		return err
	}
	if sum.NoAudio > 0 {
		fmt.Fprintf(os.Stderr, "switchboard load: %d of %d connected sessions received no audio (no_audio; left out of max_gap_ms)\n", sum.NoAudio, sum.Connected)
	}
	if n := sum.Sessions - sum.OK; n > 0 {
		return fmt.Errorf("%d of %d sessions failed: %s", n, sum.Sessions, failureLines(sum))
	}
	return nil
}

// failureLines words a summary's failures for the command's error: each
// reason with its count, most first, then each one's first error:
//
//	connect_timeout 8, signaling 2
//	  connect_timeout, first: not connected after 30s; usually …
//	  signaling, first: callclient: signaling failed: POST: 503 …
func failureLines(sum callclient.LoadSummary) string {
	reasons := slices.SortedFunc(maps.Keys(sum.Failures), func(a, b string) int {
		return cmp.Or(cmp.Compare(sum.Failures[b], sum.Failures[a]), cmp.Compare(a, b))
	})
	counts := make([]string, len(reasons))
	for i, r := range reasons {
		counts[i] = fmt.Sprintf("%s %d", r, sum.Failures[r])
	}
	var b strings.Builder
	b.WriteString(strings.Join(counts, ", "))
	for _, r := range reasons {
		if e := sum.Errors[r]; e != "" {
			fmt.Fprintf(&b, "\n  %s, first: %s", r, e)
		}
	}
	return b.String()
}

// connectedEvent is the line -connected-json prints as a session connects.
type connectedEvent struct {
	Event    string  `json:"event"`             // "connected"
	I        int     `json:"i"`                 // the session's index, in start order
	URLIndex int     `json:"url_index"`         // index into the URLs
	Session  string  `json:"session,omitempty"` // the session's URL
	SetupMS  float64 `json:"setup_ms"`          // POST to peer connection "connected"
}
