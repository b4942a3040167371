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
	c.est.farB, c.est.nearB, c.est.nearC = make([]estBandsVec, len(c.est.far)), make([]estBandsVec, estWindow), make([]estBandsVec, estWindow)
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
			c.est.pushBands(&c.nearBands, &c.farBands[(c.est.n-1)%int64(len(c.farBands))])
			if d, ok := c.est.estimate(); ok && (!c.measured || d*10 < c.delayMs-realignEarlyMs || d*10 > c.delayMs+realignLateMs) {
				c.delayMs, c.measured = d*10, true
			}
			echo = c.farHead > 0 && at-int64((c.delayMs+echoTailMs)*c.cfg.Rate/1000) < c.farHead
			if c.est.farNow() {
				c.farPlayedMs += 10
			}
		}
		// The gate acts once the echo has been found in the input (the
		// estimator locked on it): a client that cancels its own echo
		// has no frame gated. With GuardFirstReply it acts before that
		// too, while the far end has played less than GuardMs: the
		// first syllables of the first reply come back before any
		// estimate can.
		gate := echo && (c.measured || c.cfg.GuardFirstReply && c.farPlayedMs <= GuardMs)
		// The module runs for the gate's frames, and for every frame
		// with noise suppression. Until the echo is found the frame
		// leaves as it came and the module costs nothing: with nothing
		// to cancel, its suppressor still took the first syllable of a
		// talker over the agent down by a frame or two, and a client
		// that cancels its own echo (most) never pays for that.
		if gate || c.cfg.NoiseReduction != "" {
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
			if gate {
				early, late := dtEarly, dtLate
				if !c.measured {
					early, late = dtEarlyGuess, dtLateGuess // the initial delay is a guess
				}
				// The echo can come from early frames after the delay in
				// use, or after the latest estimate when that is earlier
				// (the reference lags a shrinking delay by up to
				// realignEarlyMs, and the estimate, over 2 s, lags the
				// echo: a reply that began as a drifting delay turned
				// was cut by its first syllable when only the delay in
				// use counted), to late frames before the delay in use
				// (the estimate's error the other way, and the room's
				// tail; widening this side too took interruptions
				// 200-500 ms later).
				lag := c.delayMs / 10
				from, to := lag-early, lag+late
				if c.measured && c.est.lag >= 0 {
					from = min(from, c.est.lag-early)
				}
				loudest, aligned := c.est.farAround(lag, from, to)
				c.farBound(from, to)
				talk := c.dt.frame(&c.nearBands, &c.bound, c.gate.coupling)
				c.gate.frame(c.near, nearDB, loudest, aligned, talk, c.measured)
				if talk && !c.measured {
					// The guard, with no echo found yet: the user's frame
					// passes as it came, not as the module's suppressor
					// left it (which took the first 30-50 ms of a client
					// with no echo 25-40 dB down).
					copy(c.near, c.curNear)
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

	// Band levels (estimateBands), merged and clamped: rings as near's and
	// far's; nearC is scratch, the near window centred.
	nearB, farB, nearC []estBandsVec
}

// estBandFloorDB is the level band levels are clamped to from below
// before they are correlated: silence is one value, not a range of
// rounding noise.
const estBandFloorDB = -90

// numEstBands is how many bands the estimator correlates: the Cleaner's
// bands merged in pairs, which keeps the spectrum's shape at half the
// cost.
const numEstBands = numBands / 2

// estBandsVec is one frame's levels as the estimator keeps them.
type estBandsVec [numEstBands]float32

// pushBands records the newest frame's band levels, near and far (call
// after push).
func (e *delayEstimator) pushBands(near, far *bands) {
	i := e.n - 1
	nv, fv := &e.nearB[i%int64(len(e.nearB))], &e.farB[i%int64(len(e.farB))]
	for b := range nv {
		nv[b] = float32(max((near[2*b]+near[2*b+1])/2, estBandFloorDB))
		fv[b] = float32(max((far[2*b]+far[2*b+1])/2, estBandFloorDB))
	}
}

// estimate returns a new lag, in frames, when one was computed on this
// frame and differs from the last: the lag at which the far end's
// spectrogram (numEstBands bands) best matches the input's over the last
// estWindow frames, each band centred on its mean over the window, the
// covariances summed over bands and normalized by the summed variances
// (a Pearson correlation of the two spectrograms). A talker over the echo
// shares the echo's rhythm at a wrong lag more often than its spectrum:
// one energy envelope, tried first, locked on the user's interruptions
// about 1 s into each reply as an echo 1 s late.
func (e *delayEstimator) estimate() (int, bool) {
	w := min(e.n, estWindow)
	if w < estMinWindow || e.n%estEvery != 0 {
		return 0, false
	}
	nw, nf := int64(len(e.nearB)), int64(len(e.farB))
	// The near window, centred per band.
	var nm [numEstBands]float64
	for k := e.n - w; k < e.n; k++ {
		for b, v := range e.nearB[k%nw] {
			nm[b] += float64(v)
		}
	}
	for b := range nm {
		nm[b] /= float64(w)
	}
	var nvar float64
	for k := e.n - w; k < e.n; k++ {
		x := &e.nearB[k%nw]
		c := &e.nearC[k-(e.n-w)]
		for b := range x {
			c[b] = float32(float64(x[b]) - nm[b])
			nvar += float64(c[b]) * float64(c[b])
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
	// The far window's sums per band, slid one frame further back per
	// lag; and its active frames.
	var fs, fq [numEstBands]float64
	active := 0
	for k := e.n - w; k < e.n; k++ {
		j := k % nf
		for b, v := range e.farB[j] {
			fs[b] += float64(v)
			fq[b] += float64(v) * float64(v)
		}
		if e.farActive[j] {
			active++
		}
	}
	for lag := 0; lag <= e.maxLag; lag++ {
		if lag > 0 {
			// Frame n-1-(lag-1) leaves the window, n-w-lag enters.
			out, in := e.n-int64(lag), e.n-w-int64(lag)
			if in < 0 {
				break
			}
			jo, ji := out%nf, in%nf
			for b := range fs {
				vo, vi := float64(e.farB[jo][b]), float64(e.farB[ji][b])
				fs[b] += vi - vo
				fq[b] += vi*vi - vo*vo
			}
			if e.farActive[jo] {
				active--
			}
			if e.farActive[ji] {
				active++
			}
		}
		if active < estMinFar {
			e.corr[lag] = 0
			continue
		}
		// The near window is centred, so the far's mean drops out of
		// the covariance.
		var fvar float64
		for b := range fs {
			fvar += fq[b] - fs[b]*fs[b]/float64(w)
		}
		if fvar <= 0 {
			continue
		}
		var cov float64
		base := e.n - w - int64(lag)
		for i := int64(0); i < w; i++ {
			f := &e.farB[(base+i)%nf]
			c := &e.nearC[i]
			var s float32
			for b := range f {
				s += c[b] * f[b]
			}
			cov += float64(s)
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
	estEvery     = 20  // re-estimate every 200 ms (the delay drifts a few ms in that time)
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

// farAround returns the loudest far end (dB) in the 10 ms frames that the
// newest input frame's echo can come from, lags from to to, and the far
// end at lag.
func (e *delayEstimator) farAround(lag, from, to int) (loudest, aligned float64) {
	nf := int64(len(e.far))
	m := -200.0
	aligned = -200
	if k := e.n - 1 - int64(lag); lag >= 0 && lag <= e.maxLag && k >= 0 {
		aligned = e.far[k%nf]
	}
	for l := from; l <= to; l++ {
		k := e.n - 1 - int64(l)
		if l < 0 || l > e.maxLag || k < 0 {
			continue
		}
		m = max(m, e.far[k%nf])
	}
	return m, aligned
}

// farBound sets c.bound to the far end's loudest level per band in the
// 10 ms frames the newest input frame's echo can come from: lags from to
// to, in frames.
func (c *Cleaner) farBound(from, to int) {
	e := &c.est
	nf := int64(len(c.farBands))
	for b := range c.bound {
		c.bound[b] = -200
	}
	for l := from; l <= to; l++ {
		k := e.n - 1 - int64(l)
		if l < 0 || l > e.maxLag || k < 0 {
			continue
		}
		fb := &c.farBands[k%nf]
		for b := range c.bound {
			c.bound[b] = max(c.bound[b], fb[b])
		}
	}
}

// doubleTalk tells an input frame that holds the user's voice from one
// that holds only the echo, by band, before the canceller: the echo in a
// band is never much louder than the far end's loudest there around the
// delay, through the echo path's coupling (the echo gate's, measured
// broadband). A frame in which dtBands bands stand dtMarginDB over that,
// and dtFloorMarginDB over their noise floor, holds something the far end
// did not play: the voices of two talkers put their harmonics and
// formants in different bands even where the two are as loud overall. The
// far end is taken at its loudest over a window wider than the delay's
// error, so the echo's time stretching, the far end's coding and the
// room's tail stay under it; what it costs is the user's first tens of
// milliseconds over a loud echo (docs/vad.md).
type doubleTalk struct {
	floor bands // dB per band: the input's noise floor, a low percentile
	prevN int   // bands over in the frame before
	talk  int64 // frames found to hold the user
}

// The window, in 10 ms frames, around the delay in use that the far end's
// loudest is taken over before the delay is measured...
const (
	dtEarlyGuess = 12
	dtLateGuess  = 14
)

// ...and after.
const (
	dtEarly = 5
	dtLate  = 12
)

const (
	dtMarginDB      = 6.0   // dB over the loudest echo the far end can make
	dtBands         = 3     // bands over, in this frame and the one before...
	dtConfirmBands  = 6     // ...or in this frame alone
	dtFloorMarginDB = 12.0  // dB over a band's noise floor
	dtMinBandDB     = -85.0 // a band under this level holds nothing a detector hears
	dtStepDB        = 0.5   // dB per frame: how fast the noise floors move
)

func (d *doubleTalk) init() {
	for i := range d.floor {
		d.floor[i] = -120
	}
}

// frame reports whether x (the input's band levels, before the canceller)
// holds more than the echo of bound (the far end's loudest per band
// around the delay) through a path of couplingDB. One frame over in a few
// bands is how the echo strays now and then (a syllable the two Opus
// codings made differently); the user stays over, so a few bands must be
// over in two frames running, or many in one.
func (d *doubleTalk) frame(x, bound *bands, couplingDB float64) bool {
	n := 0
	for b := range x {
		if x[b] > d.floor[b]+dtFloorMarginDB && x[b] > dtMinBandDB && x[b]-bound[b] > couplingDB+dtMarginDB {
			n++
		}
		quantile(&d.floor[b], x[b], 0.1, dtStepDB)
	}
	talk := n >= dtBands && (d.prevN >= dtBands || n >= dtConfirmBands)
	d.prevN = n
	if talk {
		d.talk++
	}
	return talk
}

// echoGate is the Cleaner's last stage, after the echo canceller: a frame
// in which the echo of something played can be heard and in which the
// double-talk detector found nothing but that echo is brought down to
// the input's noise floor. WebRTC's canceller leaves 15 to 35 dB less
// echo (its ERLE), and what it leaves still sounds like speech to a VAD.
// It is the rule of a speakerphone's residual echo suppressor, decided
// per 10 ms frame. It also measures the echo path's coupling, broadband,
// that the detector's threshold rests on.
type echoGate struct {
	// coupling is the input's level over the far end's at the delay,
	// dB, the median while the far end plays: input under -85 dBFS
	// counts (at -85) until the delay is measured, so that a client with
	// no echo shows a coupling far under 0 within a second of the first
	// reply, and not after, when the echo's pauses would pull a measured
	// coupling down.
	coupling float64
	floor    float64 // dB: the output's noise floor, a low percentile while no echo can be heard
	settled  int     // frames that taught the coupling since the delay was measured, up to gateSettleFrames
	gated    int64
}

const (
	gateStepDB           = 0.1 // dB per frame: how fast the floor moves, and the coupling once settled
	gateGuessStepDB      = 2.0 // the coupling's, until the delay is measured
	gateSettleStepDB     = 0.5 // the coupling's, for gateSettleFrames after
	gateSettleFrames     = 200
	gateCouplingQuantile = 0.5  // the coupling: the median
	gateFloorQuantile    = 0.2  // the floor: a low percentile
	gateFarActive        = -50. // dBFS: far end loud enough to judge the coupling
)

func (g *echoGate) init() {
	g.coupling = 0 // until measured: echo as loud as the far end
	g.floor = -90
}

// frame gates one output frame x; nearDB is the input's level before the
// canceller, farDB the far end's loudest that its echo can come from and
// alignedDB the far end's at the delay, talk the double-talk detector's
// verdict, measured whether the delay is.
func (g *echoGate) frame(x []int16, nearDB, farDB, alignedDB float64, talk, measured bool) {
	if alignedDB > gateFarActive && (nearDB > -85 || !measured) {
		step := gateStepDB
		switch {
		case !measured:
			step = gateGuessStepDB
		case g.settled < gateSettleFrames:
			step = gateSettleStepDB
			g.settled++
		}
		quantile(&g.coupling, max(nearDB, -85)-alignedDB, gateCouplingQuantile, step)
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
