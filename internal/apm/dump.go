package apm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// A dump is a Cleaner's inputs as they came, for replaying a real session
// offline through the Cleaner (the way WebRTC's "aecdump" diagnostic
// recordings are used): what it played and what it heard, with the
// times and positions it was given. It holds the user's voice: an
// operator turns it on for a diagnosis only (the transceiver's
// echo_dump_dir), never by default.
//
// Layout, little-endian: the 8-byte magic "SBAPMDP1", the rate (uint32,
// Hz), then records to the end: a kind byte (DumpPlayed or
// DumpProcessed), the time (int64, Unix ns: Played's at, Process's
// arrived), the input position (int64 samples; 0 for DumpPlayed), the
// length of the PCM (uint32, bytes) and the PCM (PCM16LE, as given, before
// cleaning).
const dumpMagic = "SBAPMDP1"

// Dump record kinds.
const (
	DumpPlayed    byte = 'P' // a Played call
	DumpProcessed byte = 'C' // a Process call (its input before cleaning)
)

// DumpRecord is one call a dump recorded.
type DumpRecord struct {
	Kind byte      // DumpPlayed or DumpProcessed
	At   time.Time // Played's at, or Process's arrived
	Pos  int64     // Process's input position (samples); 0 for Played
	PCM  []byte    // PCM16LE, valid until the next record is read
}

// ErrDump: a dump that cannot be read (not a dump, or cut short).
var ErrDump = errors.New("apm: bad dump")

// DumpTo makes c write every later Played and Process call's inputs to w
// (the layout above), until Close. Writes go through a buffer; Close
// flushes it and DumpErr returns the first write error (the dump stops
// there; cleaning goes on).
func (c *Cleaner) DumpTo(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var hdr [12]byte
	copy(hdr[:], dumpMagic)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(c.cfg.Rate))
	if _, err := bw.Write(hdr[:]); err != nil {
		return err
	}
	c.dump = bw
	return nil
}

// DumpErr returns the first error writing the dump (nil without one).
func (c *Cleaner) DumpErr() error { return c.dumpErr }

func (c *Cleaner) dumpRecord(kind byte, at time.Time, pos int64, pcm []byte) {
	if c.dump == nil {
		return
	}
	var h [21]byte
	h[0] = kind
	binary.LittleEndian.PutUint64(h[1:], uint64(at.UnixNano()))
	binary.LittleEndian.PutUint64(h[9:], uint64(pos))
	binary.LittleEndian.PutUint32(h[17:], uint32(len(pcm)))
	if _, err := c.dump.Write(h[:]); err == nil {
		_, err = c.dump.Write(pcm)
		if err == nil {
			return
		}
		c.dumpErr = err
	} else {
		c.dumpErr = err
	}
	c.dump = nil
}

func (c *Cleaner) closeDump() {
	if c.dump != nil {
		if err := c.dump.Flush(); err != nil && c.dumpErr == nil {
			c.dumpErr = err
		}
		c.dump = nil
	}
}

// ReadDump reads a dump from r: its rate, then each record in turn to f,
// stopping at the first error f returns. A dump cut short (a session
// whose transceiver stopped mid-write) yields the records before the cut
// and an error wrapping ErrDump.
func ReadDump(r io.Reader, f func(rate int, rec DumpRecord) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var hdr [12]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil || string(hdr[:8]) != dumpMagic {
		return fmt.Errorf("%w: no %s header", ErrDump, dumpMagic)
	}
	rate := int(binary.LittleEndian.Uint32(hdr[8:]))
	var h [21]byte
	var pcm []byte
	for n := 0; ; n++ {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("%w: record %d: %v", ErrDump, n, err)
		}
		l := binary.LittleEndian.Uint32(h[17:])
		if l > 1<<20 || h[0] != DumpPlayed && h[0] != DumpProcessed {
			return fmt.Errorf("%w: record %d: kind %q, %d bytes", ErrDump, n, h[0], l)
		}
		if cap(pcm) < int(l) {
			pcm = make([]byte, l)
		}
		pcm = pcm[:l]
		if _, err := io.ReadFull(br, pcm); err != nil {
			return fmt.Errorf("%w: record %d cut short: %v", ErrDump, n, err)
		}
		rec := DumpRecord{Kind: h[0], At: time.Unix(0, int64(binary.LittleEndian.Uint64(h[1:]))), Pos: int64(binary.LittleEndian.Uint64(h[9:])), PCM: pcm}
		if err := f(rate, rec); err != nil {
			return err
		}
	}
}
