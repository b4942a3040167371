package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
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
echoes (switchboard agent); with -echo=false (a real agent) nothing is
checked for an echo and gaps describe the backend's own audio.

Flags:`)
		fs.PrintDefaults()
	}
	fs.IntVar(&opts.Sessions, "sessions", 10, "concurrent sessions")
	fs.DurationVar(&opts.Duration, "duration", 30*time.Second, "audio streamed per session")
	fs.DurationVar(&opts.Ramp, "ramp", 50*time.Millisecond, "delay between two session starts")
	fs.StringVar(&audio, "audio", "", "16-bit PCM WAV file every session sends as Opus, looped (default: 60-byte counter payloads, no encoding cost)")
	fs.StringVar(&opts.AuthToken, "token", "", "bearer token for signaling (a client token or an API key)")
	echo := fs.Bool("echo", true, "the backend echoes audio and data-channel messages (switchboard agent): check the echo and report loss; false for a real agent")
	fs.DurationVar(&opts.ConnectTimeout, "connect-timeout", 30*time.Second, "bound on signaling, ICE and DTLS per session")
	fs.DurationVar(&interval, "progress", 2*time.Second, "interval of the progress line on stderr (0 = none)")
	fs.BoolVar(&jsonl, "sessions-json", false, "also print each session's result as a JSON line on stdout as it ends")
	headerFlag(fs, &opts.Header, `extra "Name: value" header on the POST and the DELETE (repeatable)`)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		fs.Usage()
		return fmt.Errorf("want one signaling URL (several: comma separated), got %d arguments", len(positional))
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
	var encMu sync.Mutex
	if jsonl {
		opts.OnSession = func(r callclient.SessionResult) {
			encMu.Lock()
			defer encMu.Unlock()
			_ = enc.Encode(r)
		}
	}
	l, err := callclient.NewLoad(opts)
	if err != nil {
		return err
	}
	var progress io.Writer
	if interval > 0 {
		progress = os.Stderr
	}
	sum := l.Run(ctx, progress, interval)
	enc.SetIndent("", "  ")
	if err := enc.Encode(sum); err != nil {
		return err
	}
	if n := sum.Sessions - sum.OK; n > 0 {
		return fmt.Errorf("%d of %d sessions failed: %v", n, sum.Sessions, sum.Failures)
	}
	return nil
}
