package apm

import (
	"bufio"
	"encoding/binary"
	"math"
	"sync/atomic"
	"time"
)

// live counts the Cleaners New made that are not yet closed.
var live atomic.Int64

// Live returns how many Cleaners hold the module's C memory now: made by
// New and not yet closed. A caller that makes one per session checks
// with it that every session end and every change of setting frees its
// own.
func Live() int64 { return live.Load() }

// Cleaner is one session's input cleaning: the echo canceller fed with
// the session's playout, and the noise suppressor (Config). The zero
// value is not usable; New makes one, Close frees its C memory.
type Cleaner struct {
	cfg   Config
	proc  *processor
	frame int // samples per 10 ms

	// The far end: what was played, on a timeline of samples counted from
	// origin (the first Played).
	far       []int16 // ring, len a power of two
	farMask   int64
	farHead   int64 // timeline position after the last sample written
	origin    time.Time
	hasOrigin bool

	// The near end's wall clock: the input sample at position pos was
	// captured at about nearBase + pos/rate, where nearBase tracks the
	// earliest arrival (arrival minus position) seen, creeping later
	// slowly so that it follows a path that got longer.
	nearBase    float64 // seconds since origin
	hasNearBase bool

	est  delayEstimator
	gate echoGate
	// farPlayedMs counts the far end's active audio, ms, up to the
	// warm-up's end.
	farPlayedMs int
	delayMs     int // the delay in use, ms
	measured    bool

	// Band levels (spectrum.go) for the double-talk detector: the
	// input's, before the canceller, and the far end's per frame in a
	// ring indexed as the estimator's.
	spec      *bander
	prevNear  []int16 // the input frame before, as it came
	curNear   []int16 // this one
	nearBands bands
	farBands  []bands
	farWin    []int16 // scratch: 20 ms of far end
	bound     bands   // scratch: the far end's loudest per band around the delay
	dt        doubleTalk

	near, ref []int16 // one 10 ms frame each
	quiet     []int16 // a quiet input frame as it came (quietDB)
	frames    int64   // near frames seen
	processed int64   // near frames the module processed
	closed    bool

	dump    *bufio.Writer // DumpTo: nil when not dumping
	dumpErr error
}

// alignMarginMs is how far ahead of the estimated echo the reference is
// handed to the module, which is told that delay (set_stream_delay_ms):
// the module's delay-agnostic search looks both ways from there.
const alignMarginMs = 40

// The reference stays where it is while the measured delay moves less
// than realignEarlyMs earlier or realignLateMs later than the delay in
// use: the module's filter (128 ms, from alignMarginMs before the
// expected echo) and its own delay-agnostic search follow such a drift,
// where every move of the reference would make its filter converge
// again.
const (
	realignEarlyMs = 30
	realignLateMs  = 60
)

// quietDB is the level (dBFS) under which an input frame leaves the
// cleaner as it came: it holds neither echo nor noise worth taking out
// (an echo that reaches a detector is tens of dB louder), and AEC2 fills
// what its suppressor takes with comfort noise at its own noise estimate,
// which over a near-silent input (a muted client, or digital silence,
// ±1 after Opus) came out 35 dB above it as a reply began: a VAD adapted
// to that silence heard a sound start (TestSilenceStaysSilent). The frame
// still goes through the module, whose state follows the stream.
const quietDB = -70

// echoTailMs is how long after the echo delay the echo of the last audio
// played can still be heard: the room's reverberation and the client's
// playout of its last packet, with margin.
const echoTailMs = 500

// nearBaseCreep is how fast the near clock's base moves later when no
// arrival is earlier, in seconds per second: 2 ms/s follows a path that
// grew longer within seconds while the minimum still filters the jitter
// of single packets.
const nearBaseCreep = 0.002

// New returns a Cleaner for cfg (checked with Validate).
func New(cfg Config) (*Cleaner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lvl, _ := nsLevel(cfg.NoiseReduction)
	p, err := newProcessor(cfg.Rate, cfg.EchoCancellation, lvl)
	if err != nil {
		return nil, err
	}
	c := &Cleaner{cfg: cfg, proc: p, frame: cfg.Rate / 100, delayMs: cfg.InitialDelayMs}
	// The ring holds the longest delay, the margin and a second of
	// packets sent ahead of the clock.
	n := 1
	for n < cfg.Rate*(MaxDelayMs+alignMarginMs+1000)/1000 {
		n <<= 1
	}
	c.far, c.farMask = make([]int16, n), int64(n-1)
	c.near, c.ref, c.quiet = make([]int16, c.frame), make([]int16, c.frame), make([]int16, c.frame)
	c.est.init(MaxDelayMs / 10)
	c.gate.init()
	c.spec = newBander(cfg.Rate)
	c.prevNear, c.curNear, c.farWin = make([]int16, c.frame), make([]int16, c.frame), make([]int16, 2*c.frame)
	c.farBands = make([]bands, len(c.est.far))
	c.est.farB, c.est.nearB = c.farBands, make([]bands, estWindow)
	c.dt.init()
	live.Add(1)
	return c, nil
}

// Config returns the Cleaner's configuration, defaults filled.
func (c *Cleaner) Config() Config { return c.cfg }

// Played records pcm (PCM16 little-endian, whole 10 ms frames) as played
// to the client from at on: the caller gives each packet the time the
// client plays it at, up to a constant (its send time, taken from its
// RTP timestamp within its run so that packets sent late by a busy clock
// stay back to back). Audio recorded for the same time again replaces
// the earlier; a gap is silence.
func (c *Cleaner) Played(at time.Time, pcm []byte) error {
	if c.closed {
		return ErrClosed
	}
	if len(pcm)%(2*c.frame) != 0 {
		return ErrFrameSize
	}
	c.dumpRecord(DumpPlayed, at, 0, pcm)
	if !c.hasOrigin {
		c.origin, c.hasOrigin = at, true
	}
	pos := int64(math.Round(at.Sub(c.origin).Seconds() * float64(c.cfg.Rate)))
	if pos < c.farHead-int64(len(c.far))/2 {
		return nil // long gone
	}
	// A gap is silence. One longer than the ring (the agent was quiet for
	// a while) clears the ring once: the loop would cost a sample per
	// sample of the gap, minutes of audio after a long quiet spell.
	if pos-c.farHead >= int64(len(c.far)) {
		clear(c.far)
		c.farHead = pos
	}
	for ; c.farHead < pos; c.farHead++ {
		c.far[c.farHead&c.farMask] = 0
	}
	for i := 0; i+1 < len(pcm); i += 2 {
		c.far[pos&c.farMask] = int16(binary.LittleEndian.Uint16(pcm[i:]))
		pos++
	}
	c.farHead = max(c.farHead, pos)
	return nil
}

// Process cleans pcm (PCM16 little-endian, whole 10 ms frames) in place:
// the input at position pos on the input clock (samples at the Cleaner's
// rate), whose last sample arrived at arrived.
func (c *Cleaner) Process(pcm []byte, pos int64, arrived time.Time) error {
	if c.closed {
		return ErrClosed
	}
	if len(pcm)%(2*c.frame) != 0 {
		return ErrFrameSize
	}
	c.dumpRecord(DumpProcessed, arrived, pos, pcm)
	rate := float64(c.cfg.Rate)
	if !c.hasOrigin {
		c.origin, c.hasOrigin = arrived, true
	}
	end := pos + int64(len(pcm)/2)
	base := arrived.Sub(c.origin).Seconds() - float64(end)/rate
	switch {
	case !c.hasNearBase || base < c.nearBase:
		c.nearBase, c.hasNearBase = base, true
	default:
		c.nearBase = min(base, c.nearBase+nearBaseCreep*float64(len(pcm)/2)/rate)
	}
	for off := 0; off < len(pcm); off += 2 * c.frame {
		f := pcm[off : off+2*c.frame]
		if dtFrame != nil {
			dtFrame(c.frames + 1)
		}
		copy(c.prevNear, c.curNear) // the frame before, as it came
		for i := range c.near {
			c.near[i] = int16(binary.LittleEndian.Uint16(f[2*i:]))
		}
		copy(c.curNear, c.near)
		// The far end played when this frame was captured, and as long
		// before it as the echo delay (less the margin).
		at := int64((c.nearBase + float64(pos)/rate) * rate)
		pos += int64(c.frame)
		// The module runs while the echo of something played can still
		// be in the input: from the first far-end audio to the echo
		// delay and the room's tail after the last. In between (the user
		// talks, nobody does) the frame passes as it is, unless noise
		// suppression is on, and the module's state waits unchanged.
		echo := false
		if c.cfg.EchoCancellation {
			c.est.push(energy(c.near), c.farEnergy(at))
			c.readFar(c.farWin, at-int64(2*c.frame))
			c.spec.levels(c.farWin[:c.frame], c.farWin[c.frame:], &c.farBands[(c.est.n-1)%int64(len(c.farBands))])
			c.spec.levels(c.prevNear, c.near, &c.nearBands)
			c.est.nearB[(c.est.n-1)%int64(len(c.est.nearB))] = c.nearBands
			est := c.est.estimate
			if estBands {
				est = c.est.estimateBands
			}
			if d, ok := est(); ok && (!c.measured || d*10 < c.delayMs-realignEarlyMs || d*10 > c.delayMs+realignLateMs) {
				c.delayMs, c.measured = d*10, true
			}
			echo = c.farHead > 0 && at-int64((c.delayMs+echoTailMs)*c.cfg.Rate/1000) < c.farHead
		}
		if echo || c.cfg.NoiseReduction != "" {
			inPow := energy(c.near)
			if dB(inPow) < quietDB {
				copy(c.quiet, c.near)
			}
			var nearDB float64
			if echo {
				nearDB = dB(inPow)
				c.readFar(c.ref, at-int64((c.delayMs-alignMarginMs)*c.cfg.Rate/1000))
			} else {
				clear(c.ref)
			}
			if c.cfg.EchoCancellation {
				if err := c.proc.render(c.ref); err != nil {
					return err
				}
			}
			if err := c.proc.capture(c.near, alignMarginMs); err != nil {
				return err
			}
			// The gate acts once the echo has been found in the input
			// (the estimator locked on it): a client that cancels its
			// own echo has no frame gated. With GuardFirstReply it acts
			// before that too, while the far end has played less than
			// GuardMs: the first syllables of the first reply come back
			// before any estimate can.
			if c.est.farNow() {
				c.farPlayedMs += 10
			}
			if echo && (c.measured || c.cfg.GuardFirstReply && c.farPlayedMs <= GuardMs) {
				early, late := dtEarly, dtLate
				if !c.measured {
					early, late = 12, 14 // the initial delay is a guess
				}
				loudest, aligned := c.est.farAround(c.delayMs/10, early, late)
				lag := c.delayMs / 10
				if dtLag && c.est.lag >= 0 && c.measured {
					lag = c.est.lag
				}
				c.farBound(lag, early, late)
				talk := c.dt.frame(&c.nearBands, &c.bound, c.gate.coupling, nearDB <= loudest+c.gate.coupling+dtEchoOnlyDB)
				before := c.gate.gated
				outDB := dB(energy(c.near))
				c.gate.frame(c.near, nearDB, loudest, aligned, talk, c.measured)
				if talk && dtPassRaw {
					copy(c.near, c.curNear)
				}
				if gateTrace != nil {
					gateTrace(c.frames+1, nearDB, outDB, dB(energy(c.near)), talk, c.gate.gated > before, c.delayMs)
				}
			}
			if dB(inPow) < quietDB {
				copy(c.near, c.quiet) // AEC2's comfort noise must not reach the detector
			}
			c.processed++
		}
		for i, v := range c.near {
			binary.LittleEndian.PutUint16(f[2*i:], uint16(v))
		}
		c.frames++
	}
	return nil
}

// readFar copies the far end from timeline position at into dst, silence
// where nothing was played (or the ring no longer holds it).
func (c *Cleaner) readFar(dst []int16, at int64) {
	for i := range dst {
		p := at + int64(i)
		if p < 0 || p >= c.farHead || p < c.farHead-int64(len(c.far)) {
			dst[i] = 0
			continue
		}
		dst[i] = c.far[p&c.farMask]
	}
}

// farEnergy returns the mean power of the 10 ms of far end that ends at
// timeline position at.
func (c *Cleaner) farEnergy(at int64) float64 {
	c.readFar(c.ref, at-int64(c.frame))
	return energy(c.ref)
}

func energy(x []int16) float64 {
	var s float64
	for _, v := range x {
		f := float64(v)
		s += f * f
	}
	return s / float64(len(x))
}

// Stats is what a Cleaner measured.
type Stats struct {
	// DelayMs is the echo delay in use (ms); Measured tells whether the
	// estimator found it (else it is Config.InitialDelayMs).
	DelayMs  int
	Measured bool
	// Echo holds the module's measurements; valid when
	// Config.EchoCancellation.
	Echo EchoStats
	// Frames is the 10 ms input frames seen; Processed, those the
	// module processed (with echo cancellation alone, only those that
	// can hold echo); Gated, those the echo gate attenuated as echo left
	// over.
	Frames, Processed, Gated int64
	// CouplingDB is the echo gate's estimate of the echo path's loss:
	// the input's level over the far end's, dB (0 until measured).
	CouplingDB float64
}

// Stats returns what c measured so far.
func (c *Cleaner) Stats() Stats {
	s := Stats{DelayMs: c.delayMs, Measured: c.measured, Frames: c.frames, Processed: c.processed, Gated: c.gate.gated, CouplingDB: c.gate.coupling}
	if c.cfg.EchoCancellation && !c.closed {
		s.Echo, _ = c.proc.echoStats()
	}
	return s
}

// Close frees the module; later calls do nothing.
func (c *Cleaner) Close() {
	if !c.closed {
		c.closeDump()
		c.proc.close()
		c.closed = true
		live.Add(-1)
	}
}

// delayEstimator finds the echo delay, in 10 ms frames, as the lag at
// which the far end's energy envelope best matches the input's: the
// normalized cross-correlation of log energies over the last
// estWindow frames, for lags 0 to maxLag, computed every estEvery
// frames once the far end was active in enough of the window.
type delayEstimator struct {
	maxLag     int
	near, far  []float64 // rings of log energy (dB), far longer by maxLag
	farActive  []bool
	n          int64 // frames pushed
	lag        int
	confidence float64
	corr       []float64 // scratch: correlation per lag

	// Band levels (estimateBands): the near end's ring as near's, the far
	// end's as far's (the Cleaner's farBands).
	nearB, farB []bands
}

var estBands = true

// estBandFloorDB is the level band levels are clamped to from below
// before they are correlated: silence is one value, not a range of
// rounding noise.
const estBandFloorDB = -90

// estimateBands is estimate over the band levels: the lag at which the
// far end's spectrogram best matches the input's, each band centred on
// its mean over the window, the covariances summed over bands and
// normalized by the summed variances. A talker over the echo shares the
// echo's rhythm at a wrong lag more often than its spectrum.
func (e *delayEstimator) estimateBands() (int, bool) {
	w := min(e.n, estWindow)
	if w < estMinWindow || e.n%estEvery != 0 {
		return 0, false
	}
	nw, nf := int64(len(e.nearB)), int64(len(e.farB))
	clamp := func(v float64) float64 { return max(v, estBandFloorDB) }
	var nm bands
	for k := e.n - w; k < e.n; k++ {
		for b, v := range e.nearB[k%nw] {
			nm[b] += clamp(v)
		}
	}
	var nvar float64
	for b := range nm {
		nm[b] /= float64(w)
	}
	for k := e.n - w; k < e.n; k++ {
		for b, v := range e.nearB[k%nw] {
			d := clamp(v) - nm[b]
			nvar += d * d
		}
	}
	if nvar == 0 {
		return 0, false
	}
	minC := estMinCorr
	if e.lag < 0 {
		minC = estFirstCorr
	}
	best, bestC := -1, minC
	for lag := 0; lag <= e.maxLag; lag++ {
		if e.n-w-int64(lag) < 0 {
			break
		}
		active := 0
		var fm bands
		for k := e.n - w; k < e.n; k++ {
			j := (k - int64(lag)) % nf
			if e.farActive[j] {
				active++
			}
			for b, v := range e.farB[j] {
				fm[b] += clamp(v)
			}
		}
		if active < estMinFar {
			e.corr[lag] = 0
			continue
		}
		for b := range fm {
			fm[b] /= float64(w)
		}
		var cov, fvar float64
		for k := e.n - w; k < e.n; k++ {
			fb, xb := &e.farB[(k-int64(lag))%nf], &e.nearB[k%nw]
			for b := range fb {
				fd := clamp(fb[b]) - fm[b]
				cov += (clamp(xb[b]) - nm[b]) * fd
				fvar += fd * fd
			}
		}
		if fvar == 0 {
			continue
		}
		c := cov / math.Sqrt(nvar*fvar)
		e.corr[lag] = c
		if c > bestC {
			best, bestC = lag, c
		}
	}
	if best < 0 || best == e.lag {
		return 0, false
	}
	e.lag, e.confidence = best, bestC
	return best, true
}

const (
	estWindow    = 200 // 2 s of envelope
	estMinWindow = 50  // the first estimate: 500 ms of input at least
	estEvery     = 10  // re-estimate every 100 ms
	estMinCorr   = 0.6 // a lag must explain at least this much of the input envelope
	estFirstCorr = 0.8 // the first estimate, on a short window: more
	estMinFar    = 30  // frames of active far end in the window, at least
	estActiveDB  = -55 // dBFS: far end above this is active
)

func (e *delayEstimator) init(maxLag int) {
	e.maxLag = maxLag
	e.near = make([]float64, estWindow)
	e.far = make([]float64, estWindow+maxLag)
	e.farActive = make([]bool, estWindow+maxLag)
	e.corr = make([]float64, maxLag+1)
	e.lag = -1
}

// dB of a mean power of 16-bit samples, relative to full scale, floored.
func dB(p float64) float64 { return 10 * math.Log10(p/(32768*32768)+1e-9) }

// farNow reports whether the newest far-end frame pushed is active.
func (e *delayEstimator) farNow() bool {
	return e.n > 0 && e.farActive[(e.n-1)%int64(len(e.far))]
}

func (e *delayEstimator) push(nearPow, farPow float64) {
	i := e.n
	e.near[i%int64(len(e.near))] = dB(nearPow)
	fd := dB(farPow)
	e.far[i%int64(len(e.far))] = fd
	e.farActive[i%int64(len(e.far))] = fd > estActiveDB
	e.n++
}

// estimate returns a new lag, in frames, when one was computed on this
// frame and differs from the last.
func (e *delayEstimator) estimate() (int, bool) {
	w := min(e.n, estWindow)
	if w < estMinWindow || e.n%estEvery != 0 {
		return 0, false
	}
	nw, nf := int64(len(e.near)), int64(len(e.far))
	// The near window: frames n-estWindow .. n-1. For lag L, the far
	// frames n-estWindow-L .. n-1-L, which must hold enough activity.
	var nm float64
	for k := e.n - w; k < e.n; k++ {
		nm += e.near[k%nw]
	}
	nm /= float64(w)
	var nvar float64
	for k := e.n - w; k < e.n; k++ {
		d := e.near[k%nw] - nm
		nvar += d * d
	}
	if nvar == 0 {
		return 0, false
	}
	minC := estMinCorr
	if e.lag < 0 {
		minC = estFirstCorr
	}
	best, bestC := -1, minC
	for lag := 0; lag <= e.maxLag; lag++ {
		if e.n-w-int64(lag) < 0 {
			break
		}
		var fm float64
		active := 0
		for k := e.n - w; k < e.n; k++ {
			j := (k - int64(lag)) % nf
			fm += e.far[j]
			if e.farActive[j] {
				active++
			}
		}
		if active < estMinFar {
			e.corr[lag] = 0
			continue
		}
		fm /= float64(w)
		var cov, fvar float64
		for k := e.n - w; k < e.n; k++ {
			fd := e.far[(k-int64(lag))%nf] - fm
			cov += (e.near[k%nw] - nm) * fd
			fvar += fd * fd
		}
		if fvar == 0 {
			continue
		}
		c := cov / math.Sqrt(nvar*fvar)
		e.corr[lag] = c
		if c > bestC {
			best, bestC = lag, c
		}
	}
	if best < 0 || best == e.lag {
		return 0, false
	}
	e.lag, e.confidence = best, bestC
	return best, true
}

// farAround returns the loudest far end (dB) in the 10 ms frames that the
// newest input frame's echo can come from, lag frames back: from 20 ms
// after that (the estimate's error and the module's correction) to 80 ms
// before it (the room's tail).
func (e *delayEstimator) farAround(lag, early, late int) (loudest, aligned float64) {
	nf := int64(len(e.far))
	m := -200.0
	aligned = -200
	if k := e.n - 1 - int64(lag); lag >= 0 && lag <= e.maxLag && k >= 0 {
		aligned = e.far[k%nf]
	}
	for l := lag - early; l <= lag+late; l++ {
		k := e.n - 1 - int64(l)
		if l < 0 || l > e.maxLag || k < 0 {
			continue
		}
		m = max(m, e.far[k%nf])
	}
	return m, aligned
}

// farBound sets c.bound to the far end's loudest level per band in the
// frames the newest input frame's echo can come from: within dtWide
// frames of lag, and the room's tail after (up to late frames), which
// decays by dtDecayDB a frame.
func (c *Cleaner) farBound(lag, early, late int) {
	e := &c.est
	nf := int64(len(c.farBands))
	for b := range c.bound {
		c.bound[b] = -200
	}
	for l := lag - early; l <= lag+late; l++ {
		k := e.n - 1 - int64(l)
		if l < 0 || l > e.maxLag || k < 0 {
			continue
		}
		dec := dtDecayDB * float64(max(0, l-lag-dtWide))
		fb := &c.farBands[k%nf]
		for b := range c.bound {
			c.bound[b] = max(c.bound[b], fb[b]-dec)
		}
	}
}

// doubleTalk tells an input frame that holds the user's voice from one
// that holds only the echo, by band: the echo in a band is never much
// louder than the far end's loudest there around the delay, through the
// echo path's coupling in that band (learnt as the median of input over
// far end in frames without the user); a frame in which dtBands bands
// stand dtMarginDB over that, and over the band's noise floor, holds
// something the far end did not play.
type doubleTalk struct {
	floor bands // dB per band: the input's noise floor, a low percentile
	thr   bands // dB per band: a high percentile of input over bound in echo-only frames
	prevN int   // bands over in the frame before
	talk  int64 // frames found to hold the user
}

// dtEarly is how many 10 ms frames after the delay in use the echo's
// far end is looked for: the reference moves only once the measured
// delay is realignEarlyMs earlier.
var (
	dtEarly   = 5
	dtLate    = 12
	dtWide    = 2
	dtDecayDB = 0.0
	dtLag     = false // use the estimator's latest lag
)

var (
	dtMarginDB       = 6.0
	dtBands          = 3
	dtLearned        = false
	dtLearnMarginDB  = 2.0
	dtQuantile       = 0.95
	dtEchoOnlyDB     = 0.0
	dtConfirmBands   = 6
	dtPassRaw        = false
	gateQuietTeaches = true
)

const (
	dtFloorMarginDB = 12.0
	dtMinBandDB     = -85.0 // a band under this level holds nothing a detector hears
	dtStepDB        = 0.5
	dtFarSpanDB     = 30.0 // bands this far under the far end's loudest band do not teach the coupling
)

var dtFrame func(int64)

var gateTrace func(frame int64, inDB, outDB, farDB float64, talk, gated bool, delayMs int)

var dtTrace func(x, bound, floor *bands, nAbs, nRel, active int)

func (d *doubleTalk) init() {
	for i := range d.floor {
		d.floor[i] = -120
		d.thr[i] = 0
	}
}

// frame reports whether x (the input's band levels, before the canceller)
// holds more than the echo of bound (the far end's loudest per band
// around the delay) through a path of couplingDB. echoOnly tells that the
// frame's level is no more than the echo's, broadband: such frames teach
// each band's threshold.
func (d *doubleTalk) frame(x, bound *bands, couplingDB float64, echoOnly bool) bool {
	top := -200.0
	for _, v := range bound {
		top = max(top, v)
	}
	nAbs, nRel, active := 0, 0, 0
	for b := range x {
		if x[b] <= d.floor[b]+dtFloorMarginDB || x[b] <= dtMinBandDB {
			continue
		}
		active++
		v := x[b] - bound[b]
		if v > couplingDB+dtMarginDB {
			nAbs++
		}
		if v > d.thr[b]+dtLearnMarginDB {
			nRel++
		}
	}
	n := nAbs
	if dtLearned {
		n = nRel
	}
	// One frame over in a few bands is how the echo strays (a syllable
	// the far end's Opus coded differently); the user stays over.
	talk := n >= dtBands && (d.prevN >= dtBands || n >= dtConfirmBands)
	d.prevN = n
	if dtTrace != nil {
		dtTrace(x, bound, &d.floor, nAbs, nRel, active)
	}
	for b := range x {
		quantile(&d.floor[b], x[b], 0.1, dtStepDB)
		if echoOnly && bound[b] > top-dtFarSpanDB && x[b] > d.floor[b]+dtFloorMarginDB {
			quantile(&d.thr[b], x[b]-bound[b], dtQuantile, dtStepDB)
		}
	}
	if talk {
		d.talk++
	}
	return talk
}

// echoGate is the Cleaner's last stage, after the echo canceller: a frame
// whose level is what the canceller leaves of the echo (at least
// gateMarginDB under the echo that the far end, at the echo path's
// coupling, puts into the input) is brought down to the input's noise
// floor. WebRTC's canceller leaves 15 to 35 dB less echo (its ERLE), and
// what it leaves still sounds like speech to a VAD; a talker over the
// echo is as loud as the echo or louder, and passes. It is the same rule
// as a speakerphone's residual echo suppressor, decided per 10 ms frame
// from levels only.
type echoGate struct {
	coupling float64 // dB: input over far end, a low percentile while the far end plays
	floor    float64 // dB: the output's noise floor, a low percentile while no echo can be heard
	gated    int64
}

const (
	gateMarginDB         = 10   // dB under the expected echo
	gateStepDB           = 0.5  // dB per frame: how fast the percentiles move
	gateCouplingQuantile = 0.5  // the coupling: the median
	gateFloorQuantile    = 0.2  // the floor: a low percentile
	gateFarActive        = -50. // dBFS: far end loud enough to judge the coupling
)

func (g *echoGate) init() {
	g.coupling = 0 // until measured: echo as loud as the far end
	g.floor = -90
}

// frame gates one output frame x; nearDB is the input's level before the
// canceller, farDB the far end's that its echo can come from.
func (g *echoGate) frame(x []int16, nearDB, farDB, alignedDB float64, talk, measured bool) {
	if alignedDB > gateFarActive && (nearDB > -85 || gateQuietTeaches && !measured) {
		quantile(&g.coupling, max(nearDB, -85)-alignedDB, gateCouplingQuantile, gateStepDB)
		g.coupling = min(g.coupling, 0)
	}
	p := energy(x)
	out := dB(p)
	if farDB <= -85 {
		// The floor is learnt where no echo can be: a long reply's
		// residual must not become the level gated frames are set to.
		quantile(&g.floor, out, gateFloorQuantile, gateStepDB)
	}
	if farDB <= -85 || talk || out <= g.floor {
		return
	}
	g.gated++
	gain := math.Sqrt(math.Pow(10, (g.floor-out)/10))
	for i, v := range x {
		x[i] = int16(float64(v) * gain)
	}
}

// quantile moves q toward the given percentile of the values x it sees,
// by step (a stochastic quantile estimate).
func quantile(q *float64, x, p, step float64) {
	if x < *q {
		*q -= step * (1 - p)
	} else {
		*q += step * p
	}
}
