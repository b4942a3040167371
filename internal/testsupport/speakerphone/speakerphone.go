// Package speakerphone models a client on a speakerphone with no echo
// canceller of its own, for tests of the transceiver's echo cancellation
// (internal/apm): what the client receives is played out loud and comes
// back into its microphone, later and quieter.
//
// Received Opus packets are decoded at 48 kHz and laid on a playout
// timeline as a jitter buffer plays them: by RTP timestamp, from the
// earliest arrival seen for timestamp 0, so that packets that came late or
// in a burst still play back to back and a timestamp jump is silence; a
// packet more than 500 ms off that timeline starts it again. The microphone, captured at wall time t, picks up
// the playout of t minus the echo delay, scaled by the gain. The delay
// moves between Config.MinDelay and Config.MaxDelay and back (a triangle
// of Config.DriftPeriod), as a jitter buffer's target and an audio
// device's buffering drift during a call; the moving read bends the pitch
// a little, as time stretching does.
package speakerphone

import (
	"math"
	"sync"
	"time"

	"gopkg.in/hraban/opus.v2"
)

// Rate is the sample rate the model works at, Hz.
const Rate = 48000

// Config is a speakerphone's echo path.
type Config struct {
	// MinDelay and MaxDelay bound the echo delay: from a packet's
	// arrival to its echo in the microphone. Defaults 150 and 300 ms.
	MinDelay, MaxDelay time.Duration
	// DriftPeriod is how long the delay takes to go from MinDelay to
	// MaxDelay and back. Default 20 s.
	DriftPeriod time.Duration
	// GainDB is the echo's level relative to the audio received, dB.
	// Default -6. Use Off for no echo at all.
	GainDB float64
	// Off turns the echo off: the microphone hears only the user.
	Off bool
}

// Speakerphone is one client's echo path. Safe for one goroutine calling
// Received and one calling Capture.
type Speakerphone struct {
	cfg  Config
	gain float64

	mu      sync.Mutex
	dec     *opus.Decoder
	pcm     []int16
	play    []float64 // ring of the playout timeline, samples at Rate
	head    int64     // timeline position after the last sample laid
	origin  time.Time
	started bool
	// The playout timeline: the arrival time of RTP timestamp 0, the
	// earliest seen (inRun: one was).
	runBase time.Time
	inRun   bool
}

// ringSamples is the playout the model keeps: 4 s.
const ringSamples = 4 * Rate

// New returns a speakerphone with cfg's defaults filled.
func New(cfg Config) (*Speakerphone, error) {
	if cfg.MinDelay == 0 {
		cfg.MinDelay = 150 * time.Millisecond
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = 300 * time.Millisecond
	}
	if cfg.DriftPeriod == 0 {
		cfg.DriftPeriod = 20 * time.Second
	}
	if cfg.GainDB == 0 {
		cfg.GainDB = -6
	}
	dec, err := opus.NewDecoder(Rate, 1)
	if err != nil {
		return nil, err
	}
	return &Speakerphone{cfg: cfg, gain: math.Pow(10, cfg.GainDB/20), dec: dec, pcm: make([]int16, Rate*120/1000), play: make([]float64, ringSamples)}, nil
}

// Received plays an Opus packet with RTP timestamp ts (48 kHz) that
// arrived at at.
func (s *Speakerphone) Received(payload []byte, ts uint32, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.dec.Decode(payload, s.pcm)
	if err != nil || n == 0 {
		return
	}
	if !s.started {
		s.origin, s.started = at, true
	}
	base := at.Add(-time.Duration(ts) * time.Second / Rate)
	if !s.inRun || base.Sub(s.runBase) > runSlack || s.runBase.Sub(base) > runSlack {
		s.runBase, s.inRun = base, true
	} else if base.Before(s.runBase) {
		s.runBase = base
	}
	nominal := s.runBase.Add(time.Duration(ts) * time.Second / Rate)
	pos := int64(nominal.Sub(s.origin).Seconds() * Rate)
	for ; s.head < pos; s.head++ {
		s.play[s.head%ringSamples] = 0
	}
	for i, v := range s.pcm[:n] {
		s.play[(pos+int64(i))%ringSamples] = float64(v)
	}
	s.head = max(s.head, pos+int64(n))
}

// runSlack is how far off its run's timeline a packet may arrive before
// it starts a new run.
const runSlack = 500 * time.Millisecond

// Delay returns the echo delay at elapsed time into the call.
func (s *Speakerphone) Delay(elapsed time.Duration) time.Duration {
	p := s.cfg.DriftPeriod
	ph := float64(elapsed%p) / float64(p) // 0..1
	tri := 1 - math.Abs(2*ph-1)           // 0 → 1 → 0
	return s.cfg.MinDelay + time.Duration(tri*float64(s.cfg.MaxDelay-s.cfg.MinDelay))
}

// Capture adds to mic (48 kHz samples captured from at on) the echo the
// microphone picks up then, in place.
func (s *Speakerphone) Capture(mic []int16, at time.Time) {
	if s.cfg.Off {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		return
	}
	for i := range mic {
		t := at.Add(time.Duration(i) * time.Second / Rate)
		el := t.Sub(s.origin)
		x := (el - s.Delay(el)).Seconds() * Rate
		j := int64(math.Floor(x))
		if j < 0 || j+1 >= s.head || j < s.head-ringSamples+1 {
			continue
		}
		fr := x - float64(j)
		e := s.play[j%ringSamples]*(1-fr) + s.play[(j+1)%ringSamples]*fr
		mic[i] = int16(max(-32768, min(32767, math.Round(float64(mic[i])+s.gain*e))))
	}
}
