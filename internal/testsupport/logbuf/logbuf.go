// Package logbuf is a byte buffer that goroutines and child processes may
// write to while others read it: where tests and harnesses capture logs
// and process output to show on failure or to count lines in.
package logbuf

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
)

// Buffer is an in-memory log sink safe for concurrent use. The zero value
// is empty and unbounded.
type Buffer struct {
	// Max, if positive, caps the bytes kept: writes beyond it are
	// accepted and discarded, so a chatty process cannot exhaust memory.
	Max int

	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p (or, past Max, discards it); it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Max > 0 && b.b.Len()+len(p) > b.Max {
		return len(p), nil
	}
	return b.b.Write(p)
}

// String returns everything kept so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Tail returns the last n bytes kept, prefixed with "…" when cut.
func (b *Buffer) Tail(n int) string {
	s := b.String()
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Count returns the number of non-overlapping occurrences of s.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// Reset empties the buffer.
func (b *Buffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}

// JSONField returns the string field key of the first JSON log line (one
// slog JSON handler record per line) whose "msg" is msg: how a harness
// reads the address a switchboard process bound from its start-up line,
// e.g. JSONField("http listening", "addr"). ok is false until such a
// line, with that field, has been written.
func (b *Buffer) JSONField(msg, key string) (value string, ok bool) {
	for line := range strings.Lines(b.String()) {
		if !strings.Contains(line, `"msg":`) {
			continue
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		value, ok = rec[key].(string)
		return value, ok
	}
	return "", false
}
