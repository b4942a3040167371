// Package vad detects turns in a session's decoded input audio: when the
// user starts talking and when they stop, the way OpenAI's Realtime API
// "server_vad" turn detection reports it (input_audio_buffer.speech_started
// with audio_start_ms, input_audio_buffer.speech_stopped with audio_end_ms).
//
// A Detector is fed the session's audio one frame at a time, frames of
// 10 or 20 ms (chosen when it is made) of PCM16 little-endian mono at
// 16000 or 24000 Hz (the bridge's pcm16 formats, docs/bridge.md), and
// returns at most one Event per frame. Every rule below is stated in ms
// and holds at either frame length; 10 ms frames put positions on a
// 10 ms grid. It is a pure
// state machine: no goroutines, no clock, no I/O, no allocation per frame.
//
// The voice activity decision per frame is WebRTC's VAD (the Gaussian
// mixture model of webrtc/common_audio/vad, as built by Debian's
// libwebrtc-audio-processing), linked through cgo. Its input is the band
// below 4 kHz: 16 kHz frames are given to it as they are, 24 kHz frames
// are first brought down to 8 kHz by a low-pass FIR. Around it the
// Detector adds what turns a frame classifier into a turn detector:
//
//   - a noise floor, the running median of frame energy (energy: mean
//     power over the last 60 ms, dBFS), and a margin above it that a
//     frame must clear to count besides being voiced: 14 dB × Threshold,
//     7 dB at the default. WebRTC's VAD calls babble (other people
//     talking) speech; the floor and margin are what keep the room from
//     starting a turn. Threshold also picks the engine's aggressiveness.
//   - an onset rule: speech starts when 40 ms of the last 80 ms count;
//     the reported onset is the first of them, moved back (up to 100 ms)
//     over the frames just before it whose own energy (20 ms), over the
//     whole input band, stands 3 dB above its floor: an unvoiced start (/s/)
//     has its energy above 4 kHz, where the engine does not look;
//   - an end rule: speech stops after SilenceDurationMs without a frame
//     that counts, counted from the last frame of the last counting
//     frame's energy window whose own power clears the bar (the 60 ms
//     energy outlasts the speech by up to 40 ms);
//   - with PauseDurationMs, an early pause: that much silence, counted as
//     the silence window is, reports SpeechPaused (a tentative end of
//     turn), and speech before the window runs out SpeechResumed;
//   - a count of the utterance's voiced speech (VoicedMs), which tells
//     a cough or a backchannel from a turn (MinInterruptionMs);
//   - a floor that keeps learning in speech when the energy has been
//     stationary for a second, so noise switched on mid-session (taken
//     for a talker at first) ends its false turn within seconds;
//   - a ring of the last PrefixPaddingMs (plus 180 ms) of input, so the
//     utterance can be had from its padded start (AppendSince).
//
// docs/vad.md says why this engine, how the parameters were chosen and
// how the detector did on the accuracy test.
package vad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
)

// Frame lengths a Detector takes, ms: WebRTC's VAD classifies frames of
// either. 10 ms frames put the speech end, and so the stop, on a 10 ms
// grid; 20 ms frames cost 0.7–0.85 times the CPU (docs/vad.md).
const (
	Frame10ms = 10
	Frame20ms = 20
)

// Input sample rates a Detector accepts, Hz.
const (
	Rate16k = 16000
	Rate24k = 24000
)

// maxFrameSamples is the samples in one frame at the highest rate and
// the longest frame.
const maxFrameSamples = Rate24k * Frame20ms / 1000

// onsetMs is the window of the onset rule's whole-band energy: a 20 ms
// frame alone, two 10 ms frames.
const onsetMs = 20

// tuning holds the parameters of the turn rules that the accuracy test
// was used to choose (docs/vad.md); defaultTuning is what NewDetector
// uses.
type tuning struct {
	marginPerT float64 // dB of margin above the floor per unit of Threshold
	floorQ     float64 // quantile of frame energy the floor tracks
	smoothMs   int     // ms whose mean power is a frame's energy, 20 to maxSmoothMs
	startMs    int     // ms of the last startWindowMs that must count for an onset
	speechRise float64 // dB per second the floor may rise in speech
}

var defaultTuning = tuning{marginPerT: 14, floorQ: 0.5, smoothMs: 60, startMs: 40, speechRise: 2.5}

// Fixed parts of the turn rules around the engine (see the package doc),
// in ms or per second: a detector turns them into frames of its length.
const (
	maxSmoothMs    = 80
	startWindowMs  = 80  // looked at for an onset
	maxBacktrackMs = 100 // the onset may move back over
	histMs         = startWindowMs + maxBacktrackMs
	backtrackDB    = 3.0  // dB above onsetFloor a frame needs to be moved back over
	floorStep      = 25.0 // dB per second the floor moves by
	floorRise      = 0.02 // of the distance to a frame above the floor, the most it rises by in 20 ms
	floorMin       = -80  // dBFS, the lowest floor
	statMs         = 1000 // over which stationarity is judged
	statStdDB      = 3.5  // dB: energy whose standard deviation over statMs is under this is stationary
	minEnergyDB    = -100 // dBFS given to digital silence
)

// Array sizes for the shortest frame.
const (
	maxSmooth  = maxSmoothMs / Frame10ms
	maxHist    = histMs / Frame10ms
	maxStat    = statMs / Frame10ms
	maxOnsetFr = onsetMs / Frame10ms
)

var (
	// ErrRate is returned by NewDetector for a sample rate it does not
	// take.
	ErrRate = errors.New("vad: sample rate must be 16000 or 24000 Hz")
	// ErrFrameSize is returned by Process for a frame that is not one
	// frame (FrameMs) of PCM16 mono at the detector's rate, and by
	// NewDetector for a frame length other than Frame10ms or Frame20ms.
	ErrFrameSize = errors.New("vad: frame is not one frame (10 or 20 ms, as made) of PCM16 mono")
	// ErrClosed is returned by Process after Close.
	ErrClosed = errors.New("vad: detector closed")
	// ErrUnavailable is returned by NewDetector in a build without cgo,
	// which cannot link WebRTC's VAD.
	ErrUnavailable = errors.New("vad: WebRTC VAD needs a cgo build")
)

// Kind says what an Event reports.
type Kind uint8

const (
	// None: nothing happened in this frame.
	None Kind = iota
	// SpeechStarted: the user started talking.
	SpeechStarted
	// SpeechStopped: the user stopped talking (SilenceDurationMs ago).
	SpeechStopped
	// SpeechPaused: the user has been silent for PauseDurationMs within
	// an utterance: a tentative end of turn, reported only when
	// PauseDurationMs is set. SpeechStopped or SpeechResumed follows.
	SpeechPaused
	// SpeechResumed: the user talked again after a SpeechPaused, before
	// the silence window ran out: the utterance goes on.
	SpeechResumed
)

// String returns "none", "speech_started", "speech_stopped",
// "speech_paused" or "speech_resumed".
func (k Kind) String() string {
	switch k {
	case None:
		return "none"
	case SpeechStarted:
		return "speech_started"
	case SpeechStopped:
		return "speech_stopped"
	case SpeechPaused:
		return "speech_paused"
	case SpeechResumed:
		return "speech_resumed"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is what Process reports for one frame. Positions are in
// milliseconds on the detector's input clock: 0 is the start of the
// first frame it was fed, and each frame adds its FrameMs (a bridge whose
// input clock was already running adds the position of that first frame).
type Event struct {
	Kind Kind
	// AudioMs is OpenAI's position for the event. SpeechStarted: where
	// the utterance starts including the prefix padding (audio_start_ms;
	// never before 0 nor before the previous SpeechStopped's AudioMs, so
	// utterances do not overlap). SpeechStopped: the end of the frame at which the
	// silence window ran out, so the utterance's audio includes that
	// silence (audio_end_ms). SpeechPaused: the end of the frame at
	// which the early pause (PauseDurationMs) ran out. SpeechResumed: the
	// start of the frame whose speech resumed the utterance.
	AudioMs int64
	// SpeechMs is where the engine heard the speech itself start
	// (SpeechStarted: the onset, without padding; SpeechResumed: as
	// AudioMs) or end (SpeechStopped, SpeechPaused: the end of the last
	// frame that counted as speech).
	SpeechMs int64
}

// frameStat is what the onset rule remembers of one recent frame.
type frameStat struct {
	energy float32 // dBFS, the gate's energy (band the engine sees, 60 ms)
	onset  float32 // dBFS above onsetFloor: the last 20 ms, whole input band
	counts bool    // voiced and clear of the margin
}

// Detector is a per-session turn detector (see the package doc). Create
// it with NewDetector, feed it with Process from one goroutine, and Close
// it when the session ends.
type Detector struct {
	// Set once by NewDetector.
	cfg           TurnDetection
	tune          tuning
	rate          int     // input rate, Hz
	frameMs       int     // input frame length, ms
	frameBytes    int     // input bytes per frame
	engineRate    int     // rate of the frames given to the engine, Hz
	margin        float64 // dB above the floor for a frame to count
	prefixFrames  int64
	silenceFrames int
	pauseFrames   int // 0: no SpeechPaused
	ringFrames    int
	// The rules' durations in frames of frameMs, and their per-frame
	// steps.
	smooth      int
	startWindow int
	startCount  int
	backtrack   int
	histLen     int
	statFrames  int
	onsetFrames int
	stepDB      float64 // the floor's step, dB per frame
	riseFrac    float64 // floorRise per frame
	speechRise  float64 // dB per frame
	eng         *engine
	cleanup     runtime.Cleanup

	// Per-frame state.
	dec        decimator
	samples    [maxFrameSamples]int16
	down       [maxFrameSamples / 3]int16
	frames     int64               // frames processed so far
	floor      float64             // noise floor, dBFS
	onsetFloor float64             // the same for the whole-band energy of single frames
	power      [maxSmooth]float64  // meanPower of recent frames, by index mod maxSmooth
	wideP      [maxOnsetFr]float64 // the same over the whole input band, by index mod onsetFrames
	hist       [maxHist]frameStat  // by frame index mod histLen
	statE      [maxStat]float32    // frame energies, dBFS, by frame index mod statFrames
	inSpeech   bool
	silent     int   // frames since the last one that counted, in speech
	lastSpeech int64 // index of the last frame that counted, in speech
	lastStop   int64 // frame at which the last SpeechStopped's audio ended
	paused     bool  // in speech, a SpeechPaused without its SpeechResumed
	voiced     int64 // frames that counted in the current utterance
	ring       []byte
}

// NewDetector returns a detector for rate Hz input (Rate16k or Rate24k)
// in frames of frameMs (Frame10ms or Frame20ms) configured by cfg, which
// must pass Validate. It fails with an error wrapping ErrConfig, ErrRate,
// ErrFrameSize or ErrUnavailable.
func NewDetector(cfg TurnDetection, rate, frameMs int) (*Detector, error) {
	return newDetector(cfg, rate, frameMs, defaultTuning)
}

func newDetector(cfg TurnDetection, rate, frameMs int, tune tuning) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if frameMs != Frame10ms && frameMs != Frame20ms {
		return nil, fmt.Errorf("%w: NewDetector takes frames of %d or %d ms (got %d)", ErrFrameSize, Frame10ms, Frame20ms, frameMs)
	}
	d := &Detector{cfg: cfg, rate: rate, frameMs: frameMs, tune: tune}
	switch rate {
	case Rate16k:
		d.engineRate = Rate16k
	case Rate24k:
		d.engineRate = 8000
	default:
		return nil, fmt.Errorf("%w (got %d)", ErrRate, rate)
	}
	d.frameBytes = 2 * rate * frameMs / 1000
	d.margin = d.tune.marginPerT * cfg.Threshold
	d.prefixFrames = int64((cfg.PrefixPaddingMs + frameMs - 1) / frameMs)
	d.silenceFrames = (cfg.SilenceDurationMs + frameMs - 1) / frameMs
	if p := (cfg.PauseDurationMs + frameMs - 1) / frameMs; p < d.silenceFrames {
		d.pauseFrames = p
	}
	d.smooth = max(1, min(tune.smoothMs, maxSmoothMs)/frameMs)
	d.startWindow = startWindowMs / frameMs
	d.startCount = max(1, tune.startMs/frameMs)
	d.backtrack = maxBacktrackMs / frameMs
	d.histLen = d.startWindow + d.backtrack
	d.statFrames = statMs / frameMs
	d.onsetFrames = onsetMs / frameMs
	fr := float64(frameMs) / 1000
	d.stepDB = floorStep * fr
	d.riseFrac = 1 - math.Pow(1-floorRise, float64(frameMs)/20)
	d.speechRise = tune.speechRise * fr
	d.ringFrames = int(d.prefixFrames) + d.histLen
	d.ring = make([]byte, d.ringFrames*d.frameBytes)
	eng, err := newEngine(engineMode(cfg.Threshold))
	if err != nil {
		return nil, err
	}
	d.eng = eng
	// A detector dropped without Close still frees its C memory.
	d.cleanup = runtime.AddCleanup(d, func(e *engine) { e.close() }, eng)
	return d, nil
}

// engineMode maps Threshold onto WebRTC VAD's aggressiveness: [0, 0.25)
// is mode 0 (most frames called speech), [0.25, 0.5) mode 1, [0.5, 0.75)
// mode 2, [0.75, 1] mode 3 (fewest).
func engineMode(threshold float64) int {
	return max(0, min(3, int(threshold*4)))
}

// Config returns the configuration the detector was made with.
func (d *Detector) Config() TurnDetection { return d.cfg }

// Rate returns the detector's input sample rate, Hz.
func (d *Detector) Rate() int { return d.rate }

// FrameMs returns the length of the frames Process takes, ms: Frame10ms
// or Frame20ms.
func (d *Detector) FrameMs() int { return d.frameMs }

// FrameBytes returns the length of the frames Process takes: 2 bytes per
// sample, 320 or 640 at 16 kHz (10 or 20 ms), 480 or 960 at 24 kHz.
func (d *Detector) FrameBytes() int { return d.frameBytes }

// PositionMs returns the end of the last frame processed, ms on the
// input clock.
func (d *Detector) PositionMs() int64 { return d.frames * int64(d.frameMs) }

// InSpeech reports whether the detector is between a SpeechStarted and
// its SpeechStopped.
func (d *Detector) InSpeech() bool { return d.inSpeech }

// Paused reports whether the utterance in progress is paused: a
// SpeechPaused without its SpeechResumed.
func (d *Detector) Paused() bool { return d.inSpeech && d.paused }

// VoicedMs returns the voiced speech of the utterance in progress, ms:
// the frames that counted as speech since its onset (those of the onset
// rule included); 0 outside one. A cough or a backchannel ("mm-hm") has
// little, a sentence much (TurnDetection.MinInterruptionMs).
func (d *Detector) VoicedMs() int64 {
	if !d.inSpeech {
		return 0
	}
	return d.voiced * int64(d.frameMs)
}

// SilenceMs returns how much input, ms, has not counted as speech since
// the last frame that did, within an utterance (the part of the silence
// window already run); 0 outside one.
func (d *Detector) SilenceMs() int64 {
	if !d.inSpeech {
		return 0
	}
	return int64(d.silent) * int64(d.frameMs)
}

// Process takes the next frame of input (FrameBytes bytes of PCM16
// little-endian mono; any sample values) and returns what it caused. A
// frame of the wrong length returns ErrFrameSize and is not counted on
// the input clock: give a concealed or silent frame for a lost one so
// positions stay true. Process does not keep frame.
func (d *Detector) Process(frame []byte) (Event, error) {
	if d.eng == nil {
		return Event{}, ErrClosed
	}
	if len(frame) != d.frameBytes {
		return Event{}, ErrFrameSize
	}
	n := len(frame) / 2
	for i := range n {
		d.samples[i] = int16(binary.LittleEndian.Uint16(frame[2*i:]))
	}
	copy(d.ring[int(d.frames%int64(d.ringFrames))*d.frameBytes:], frame)

	in := d.samples[:n]
	// The onset is looked for in the whole input band, 20 ms at a time:
	// an unvoiced start (/s/, /f/) has its energy above 4 kHz, where the
	// engine does not look at 24 kHz.
	wide := meanPower(in)
	if d.frames == 0 {
		d.wideP = [maxOnsetFr]float64{wide, wide}
	}
	d.wideP[d.frames%int64(d.onsetFrames)] = wide
	var wsum float64
	for _, p := range d.wideP[:d.onsetFrames] {
		wsum += p
	}
	onsetE := powerDB(wsum / float64(d.onsetFrames))
	if d.frames == 0 {
		d.onsetFloor = max(floorMin, onsetE)
	}
	if d.rate == Rate24k {
		in = d.dec.process(in, d.down[:])
	}
	voiced, err := d.eng.process(d.engineRate, in)
	if err != nil {
		return Event{}, err
	}
	power := meanPower(in)
	if d.frames == 0 {
		for i := range d.power {
			d.power[i] = power
		}
	}
	d.power[d.frames%maxSmooth] = power
	// A frame's energy is the mean power of the last 60 ms, so a single
	// short peak of noise weighs less.
	var sum float64
	for i := range int64(d.smooth) {
		sum += d.power[(d.frames+maxSmooth-i)%maxSmooth]
	}
	energy := powerDB(sum / float64(d.smooth))
	if d.frames == 0 {
		d.floor = max(floorMin, energy)
	}
	counts := voiced && energy > d.floor+d.margin
	// Where the speech in a counting frame's window ends: the last frame
	// of it whose own power clears the bar (one does: the mean does).
	// After the end of an utterance the smoothed energy counts for up to
	// smooth-1 more frames; the silence window runs from the speech.
	loudEnd := d.frames
	for loudEnd > max(0, d.frames-int64(d.smooth)+1) && powerDB(d.power[loudEnd%maxSmooth]) <= d.floor+d.margin {
		loudEnd--
	}
	d.statE[d.frames%int64(d.statFrames)] = float32(energy)
	onsetAbove := onsetE - d.onsetFloor
	d.floor = d.trackFloor(d.floor, energy)
	d.onsetFloor = d.trackFloor(d.onsetFloor, onsetE)

	cur := d.frames
	d.hist[cur%int64(d.histLen)] = frameStat{energy: float32(energy), onset: float32(onsetAbove), counts: counts}
	d.frames++

	if !d.inSpeech {
		return d.onset(cur), nil
	}
	fm := int64(d.frameMs)
	if counts {
		d.voiced++
		last := max(loudEnd, d.lastSpeech)
		// Speech after a pause resumes the utterance: a frame of its own
		// that clears the bar, not the 60 ms energy's tail.
		resumed := d.paused && last > d.lastSpeech
		d.silent = int(cur - last)
		d.lastSpeech = last
		if resumed {
			d.paused = false
			return Event{Kind: SpeechResumed, AudioMs: last * fm, SpeechMs: last * fm}, nil
		}
		return Event{}, nil
	}
	d.silent++
	if d.silent < d.silenceFrames {
		if d.pauseFrames > 0 && !d.paused && d.silent >= d.pauseFrames {
			d.paused = true
			return Event{Kind: SpeechPaused, AudioMs: d.frames * fm, SpeechMs: (d.lastSpeech + 1) * fm}, nil
		}
		return Event{}, nil
	}
	d.inSpeech, d.paused = false, false
	d.lastStop = d.frames
	return Event{Kind: SpeechStopped, AudioMs: d.frames * fm, SpeechMs: (d.lastSpeech + 1) * fm}, nil
}

// onset applies the onset rule after frame cur.
func (d *Detector) onset(cur int64) Event {
	first, count := int64(-1), 0
	hl := int64(d.histLen)
	for f := max(0, cur-int64(d.startWindow)+1); f <= cur; f++ {
		if d.hist[f%hl].counts {
			count++
			if first < 0 {
				first = f
			}
		}
	}
	if count < d.startCount {
		return Event{}
	}
	// Neither the onset nor its padding reaches back into the previous
	// utterance: frames before lastStop were counted in its silence.
	first = max(first, d.lastStop)
	lim := max(0, cur-hl+1, d.lastStop)
	for first > lim && d.hist[(first-1)%hl].onset > backtrackDB {
		first--
	}
	d.inSpeech, d.paused = true, false
	d.silent = 0
	d.lastSpeech = cur
	d.voiced = int64(count)
	audio := max(d.lastStop, first-d.prefixFrames)
	fm := int64(d.frameMs)
	return Event{Kind: SpeechStarted, AudioMs: audio * fm, SpeechMs: first * fm}
}

// trackFloor returns floor moved one step toward the floorQ quantile
// of frame energy (a stochastic quantile estimate: a single quiet frame
// does not drag it down), never under floorMin. Outside speech it rises
// faster the further the energy is above it, so that a session that
// starts in digital silence learns its room noise within about a second.
// In speech it rises by at most speechRise per frame, so a long utterance
// does not become its own floor, unless the energy has been stationary
// for the last second (standard deviation under statStdDB: steady noise,
// not the syllabic rise and fall of a talker), which is how a "speech"
// that is really noise switched on mid-session ends within seconds
// (the stationarity test of classic codec VADs such as AMR's).
func (d *Detector) trackFloor(floor, energy float64) float64 {
	if energy < floor {
		return max(floorMin, floor-d.stepDB*(1-d.tune.floorQ))
	}
	if d.inSpeech && !d.stationary() {
		return floor + d.speechRise
	}
	return floor + max(d.stepDB*d.tune.floorQ, d.riseFrac*(energy-floor))
}

// stationary reports whether the energy of the last statMs has a
// standard deviation under statStdDB.
func (d *Detector) stationary() bool {
	n := int64(d.statFrames)
	if d.frames < n {
		return false
	}
	var sum, sq float64
	es := d.statE[:n]
	for _, e := range es {
		sum += float64(e)
	}
	mean := sum / float64(n)
	for _, e := range es {
		sq += (float64(e) - mean) * (float64(e) - mean)
	}
	return sq/float64(n) < statStdDB*statStdDB
}

// meanPower returns the mean of s², s in units of full scale (1.0 for
// a full-scale square wave).
func meanPower(s []int16) float64 {
	var sum int64
	for _, v := range s {
		sum += int64(v) * int64(v)
	}
	return float64(sum) / float64(len(s)) / (32768 * 32768)
}

// powerDB returns p (from meanPower) in dB relative to full scale (dBFS),
// at least minEnergyDB.
func powerDB(p float64) float64 {
	if p <= 0 {
		return minEnergyDB
	}
	return max(minEnergyDB, 10*math.Log10(p))
}

// AppendSince appends to dst the input audio (PCM16 little-endian, as
// fed) from fromMs to PositionMs and returns it; ok is false, and dst is
// returned unchanged, when the detector no longer holds audio that old
// (it keeps PrefixPaddingMs plus 180 ms) or fromMs is not a frame
// boundary (a multiple of FrameMs) in range. Right after a SpeechStarted
// event, AppendSince(dst, ev.AudioMs) gives the utterance so far with its
// prefix padding.
func (d *Detector) AppendSince(dst []byte, fromMs int64) (_ []byte, ok bool) {
	fm := int64(d.frameMs)
	if fromMs < 0 || fromMs%fm != 0 || fromMs > d.PositionMs() {
		return dst, false
	}
	from := fromMs / fm
	if d.frames-from > int64(d.ringFrames) {
		return dst, false
	}
	for f := from; f < d.frames; f++ {
		off := int(f%int64(d.ringFrames)) * d.frameBytes
		dst = append(dst, d.ring[off:off+d.frameBytes]...)
	}
	return dst, true
}

// Close frees the engine. It is idempotent; Process after Close returns
// ErrClosed.
func (d *Detector) Close() {
	if d.eng != nil {
		d.cleanup.Stop()
		d.eng.close()
		d.eng = nil
	}
}
