package audio

import (
	"encoding/binary"
	"fmt"

	"gopkg.in/hraban/opus.v2"
)

// Sequence number validation, after RFC 3550 Appendix A.1: a packet up to
// maxDropout ahead of the last one decoded is in order (the ones between
// were lost); up to maxMisorder behind, it is late and dropped; further in
// either direction it is a jump, taken (as a restart of the sender's
// numbering) only when the next packet follows it. resyncLate late packets
// in a row are a restart too.
const (
	maxDropout  = 100 // 2 s of 20 ms packets
	maxMisorder = 100
	resyncLate  = 10
)

// MaxConceal is the longest run of lost audio a Decoder conceals, in
// milliseconds. A longer hole in the sequence numbers is not filled: the
// next frame's timestamp jumps instead (as for DTX).
const MaxConceal = 200

// Frame is one 20 ms frame of decoded audio.
type Frame struct {
	// Seq counts frames: +1 per frame, from 0, wrapping at 2^16. It has no
	// gaps: concealed frames are numbered like decoded ones.
	Seq uint16
	// Timestamp is the frame's first sample, counted in samples at the
	// decoder's rate from the stream's first sample, wrapping at 2^32. It
	// advances by one frame per frame, and jumps over time the client sent
	// nothing for (DTX, or a hole longer than MaxConceal).
	Timestamp uint32
	// PCM is the frame as 16-bit signed little-endian mono samples (960
	// bytes at 24 kHz). It aliases the decoder's buffer.
	PCM []byte
	// Concealed is set when any sample of the frame was synthesized by
	// loss concealment (in-band FEC or PLC) or padding, not decoded from
	// a packet that arrived.
	Concealed bool
}

// DecoderStats counts what a Decoder did with the packets it was given.
type DecoderStats struct {
	Packets       uint64 // packets decoded
	Invalid       uint64 // packets dropped: not valid Opus (RFC 6716 §3.4) or refused by libopus
	Late          uint64 // packets dropped: older than or equal to the last one decoded (reordered, duplicated), or a jump not yet confirmed
	FECSamples    uint64 // samples of lost packets recovered from the next packet's in-band FEC (or PLC when it had none)
	PLCSamples    uint64 // samples made by packet loss concealment
	Discontinuity uint64 // jumps in the timestamp: DTX, or a hole longer than MaxConceal
	Resyncs       uint64 // restarts on a stream whose sequence numbers went back (resyncLate late packets in a row)
}

// Decoder decodes one client's Opus RTP stream into 20 ms PCM frames at
// one rate, concealing lost packets so that the frames form a continuous
// clock while packets arrive.
//
// Losses are found from RTP sequence numbers: when packets are missing
// before the one given, their audio (the RTP timestamp gap, at most
// MaxConceal) is made by libopus packet loss concealment, except the last
// lost packet's duration, which is decoded from this packet's in-band FEC
// data (RFC 6716 §2.1.7; libopus falls back to PLC when there is none).
// A timestamp gap without missing sequence numbers is discontinuous
// transmission (RFC 7587 §3.1.3): nothing is synthesized, the next
// frame's Timestamp jumps by the gap. Packets older than the last one
// decoded are dropped.
type Decoder struct {
	dec   *opus.Decoder
	rate  int
	frame int // samples per frame
	div   int // rtpRate / rate

	buf  []int16 // decode scratch: MaxPacketDuration at rate, plus concealment
	out  []byte  // frame PCM bytes, all frames of one Push back to back
	fs   []Frame // frames returned by Push
	part []byte  // Partial's PCM

	// The frame being assembled.
	pend          []int16
	pendConcealed bool

	started   bool
	lastSeq   uint16
	lastTS    uint32 // RTP timestamp of the last packet decoded
	lastDur   int    // its duration at 48 kHz
	lateRun   int    // packets in a row older than lastSeq
	probation bool   // a packet far from lastSeq was seen: badSeq would confirm a restart
	badSeq    uint16
	seq       uint16 // next frame's Seq
	ts        uint32 // Timestamp of the first sample in pend

	stats DecoderStats
}

// NewDecoder returns a decoder producing mono frames at rate Hz (16000 or
// 24000 for the bridge; any rate libopus supports).
func NewDecoder(rate int) (*Decoder, error) {
	if !validRate(rate) {
		return nil, fmt.Errorf("audio: decoder rate %d Hz: want 8000, 12000, 16000, 24000 or 48000", rate)
	}
	dec, err := opus.NewDecoder(rate, 1)
	if err != nil {
		return nil, fmt.Errorf("audio: opus decoder: %w", err)
	}
	frame := FrameSamples(rate)
	maxConceal := MaxConceal * rate / 1000
	maxPacket := MaxPacketDuration / (rtpRate / rate)
	return &Decoder{
		dec:   dec,
		rate:  rate,
		frame: frame,
		div:   rtpRate / rate,
		buf:   make([]int16, maxConceal+maxPacket),
		out:   make([]byte, 0, 2*(maxConceal+maxPacket+frame)),
		pend:  make([]int16, 0, frame),
		part:  make([]byte, 0, 2*frame),
	}, nil
}

// Partial returns the frame being assembled: the samples decoded since
// the last frame Push returned, fewer than a frame (none after a Push
// that ended on a frame boundary; with 10 ms packets, half a frame after
// every other one). Its Seq and Timestamp are those the frame will have
// once Push completes it with the same samples first, so a caller can
// look at decoded audio as soon as it is decoded (turn detection on
// 10 ms packets) and still take whole frames for the rest. The PCM is
// valid until the next Push or Partial.
func (d *Decoder) Partial() Frame {
	d.part = d.part[:0]
	for _, s := range d.pend {
		d.part = binary.LittleEndian.AppendUint16(d.part, uint16(s))
	}
	return Frame{Seq: d.seq, Timestamp: d.ts, PCM: d.part, Concealed: d.pendConcealed}
}

// Rate returns the decoder's output sample rate in Hz.
func (d *Decoder) Rate() int { return d.rate }

// Stats returns the decoder's counters.
func (d *Decoder) Stats() DecoderStats { return d.stats }

// Push decodes the Opus payload of one RTP packet (sequence number seq,
// timestamp ts at 48 kHz) and returns the frames it completes, possibly
// none (a 10 ms packet completes every other frame) and possibly several
// (concealed losses, packets longer than 20 ms). Sequence numbers are
// validated after RFC 3550 A.1: a packet far from the last one (more than
// 100 either way) is dropped unless the next one follows it, in which case
// the stream restarted and the decoder follows it; so does it after 10
// late packets in a row. The frames and their PCM are valid until
// the next Push. Bad packets are dropped and counted in
// Stats, never returned as an error.
func (d *Decoder) Push(seq uint16, ts uint32, payload []byte) []Frame {
	d.out, d.fs = d.out[:0], d.fs[:0]
	dur, err := PacketDuration(payload)
	if err != nil {
		d.stats.Invalid++
		return nil
	}
	if d.started {
		ahead := int(int16(seq - d.lastSeq))
		switch {
		case ahead > 0 && ahead <= maxDropout: // in order, perhaps after losses
			gap := int(int32(ts-d.lastTS)) - d.lastDur // 48 kHz samples between the last packet's end and this one
			switch {
			case ahead > 1 && gap > 0 && gap <= MaxConceal*rtpRate/1000:
				d.conceal(gap, dur, payload)
			case gap > 0:
				d.discontinuity(gap)
			}
		case ahead <= 0 && ahead >= -maxMisorder && d.lateRun+1 < resyncLate:
			d.lateRun++ // reordered or duplicated: its time has passed
			d.stats.Late++
			return d.fs
		case ahead <= 0 && ahead >= -maxMisorder, d.probation && seq == d.badSeq:
			// resyncLate late packets in a row, or two in sequence after a
			// jump: the sender restarted its numbering. Follow it.
			d.stats.Resyncs++
			d.discontinuity(0)
		default:
			// A jump (RFC 3550 A.1): taken only once the next packet
			// follows it, so one stray packet cannot derail the stream.
			d.probation, d.badSeq = true, seq+1
			d.stats.Late++
			return d.fs
		}
	}
	d.lateRun, d.probation = 0, false
	n, err := d.dec.Decode(payload, d.buf)
	if err != nil {
		d.stats.Invalid++
		return d.fs
	}
	d.started, d.lastSeq, d.lastTS, d.lastDur = true, seq, ts, dur
	d.stats.Packets++
	d.add(d.buf[:n], false)
	return d.fs
}

// conceal synthesizes gap samples (48 kHz) of lost audio before payload,
// whose duration is dur: PLC for all but the last lost packet's share,
// then in-band FEC from payload for that share.
func (d *Decoder) conceal(gap, dur int, payload []byte) {
	fec := min(gap, dur) / d.div
	plc := gap/d.div - fec
	// libopus conceals in multiples of 2.5 ms; gap and dur are such
	// multiples at 48 kHz, and 2.5 ms is a whole number of samples at
	// every supported rate.
	if plc > 0 {
		pcm := d.buf[:plc:plc] // the library passes cap(pcm) as the frame size
		if d.dec.DecodePLC(pcm) != nil {
			clear(pcm)
		}
		d.stats.PLCSamples += uint64(plc)
		d.add(pcm, true)
	}
	if fec > 0 {
		pcm := d.buf[:fec:fec]
		if d.dec.DecodeFEC(payload, pcm) != nil {
			clear(pcm)
		}
		d.stats.FECSamples += uint64(fec)
		d.add(pcm, true)
	}
}

// discontinuity skips gap samples (48 kHz) of time nothing was sent for:
// the frame being assembled is completed with silence and the next one
// starts gap later.
func (d *Decoder) discontinuity(gap int) {
	if gap > 0 {
		d.stats.Discontinuity++
	}
	skip := gap / d.div
	if len(d.pend) > 0 {
		fill := d.frame - len(d.pend)
		for range fill {
			d.pend = append(d.pend, 0)
		}
		d.pendConcealed = true
		d.emit()
		skip = max(skip-fill, 0)
	}
	d.ts += uint32(skip)
}

// add appends samples to the frame being assembled, emitting each
// completed frame.
func (d *Decoder) add(pcm []int16, concealed bool) {
	for len(pcm) > 0 {
		n := min(d.frame-len(d.pend), len(pcm))
		d.pend = append(d.pend, pcm[:n]...)
		d.pendConcealed = d.pendConcealed || concealed
		pcm = pcm[n:]
		if len(d.pend) == d.frame {
			d.emit()
		}
	}
}

// emit turns the assembled frame into a Frame.
func (d *Decoder) emit() {
	start := len(d.out)
	for _, s := range d.pend {
		d.out = binary.LittleEndian.AppendUint16(d.out, uint16(s))
	}
	d.fs = append(d.fs, Frame{Seq: d.seq, Timestamp: d.ts, PCM: d.out[start:len(d.out):len(d.out)], Concealed: d.pendConcealed})
	d.seq++
	d.ts += uint32(d.frame)
	d.pend, d.pendConcealed = d.pend[:0], false
}
