package transceiver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/logging"
)

// Pion's own log lines (DTLS, SCTP, data channels, from internal/peer) go
// through the transceiver's slog logger, in its format and at its level,
// with the Pion scope in the "pion" attribute, instead of Pion's default
// text logger on stderr.
//
// Levels: Pion's errors are slog errors. Its warnings are slog debug, as
// are its info and debug lines: they are about one packet (a check with a
// wrong username, a DTLS record that does not decrypt) or one
// connection's races while it closes ("stream is already closed"), and
// Pion's own default logger shows none of them either; its info lines
// are ICE state changes the transceiver logs itself as session events.
// Trace is slog debug-4.
//
// A flood of bad packets must not become a log flood: each scope may log
// pionLogBurst lines at once and pionLogRate a second after that; lines
// beyond are dropped and counted in
// switchboard_transceiver_pion_log_suppressed_total.

// Per-scope limit on Pion log lines.
const (
	pionLogBurst = 20
	pionLogRate  = 5 // lines per second, refilled continuously
)

// pionLogs is a pion/logging.LoggerFactory backed by slog.
type pionLogs struct {
	log        *slog.Logger
	suppressed atomic.Uint64 // lines dropped over the limit

	mu      sync.Mutex
	buckets map[string]*logBucket  // by scope; guarded by mu
	loggers map[string]*pionLogger // by scope; guarded by mu
}

// logBucket is one scope's token bucket.
type logBucket struct {
	tokens float64
	last   time.Time
}

var _ logging.LoggerFactory = (*pionLogs)(nil)

func newPionLogs(log *slog.Logger) *pionLogs {
	return &pionLogs{log: log, buckets: make(map[string]*logBucket), loggers: make(map[string]*pionLogger)}
}

// Suppressed returns the number of lines dropped over the limit.
func (f *pionLogs) Suppressed() uint64 { return f.suppressed.Load() }

// NewLogger returns the logger for one Pion scope ("dtls", "sctp",
// "datachannel", …). Pion asks for several per session; a scope's logger holds
// nothing but the scope, so every session shares one (a new slog.With
// each time kept about 3 KiB per session).
func (f *pionLogs) NewLogger(scope string) logging.LeveledLogger {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.loggers[scope]
	if l == nil {
		l = &pionLogger{f: f, scope: scope, log: f.log.With("pion", scope)}
		f.loggers[scope] = l
	}
	return l
}

// allow takes a token from scope's bucket.
func (f *pionLogs) allow(scope string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[scope]
	if b == nil {
		b = &logBucket{tokens: pionLogBurst, last: now}
		f.buckets[scope] = b
	}
	b.tokens = min(pionLogBurst, b.tokens+now.Sub(b.last).Seconds()*pionLogRate)
	b.last = now
	if b.tokens < 1 {
		f.suppressed.Add(1)
		return false
	}
	b.tokens--
	return true
}

// pionLogger is one scope's logging.LeveledLogger.
type pionLogger struct {
	f     *pionLogs
	scope string
	log   *slog.Logger
}

const levelTrace = slog.LevelDebug - 4

func (l *pionLogger) emit(level slog.Level, msg string) {
	if !l.log.Enabled(context.Background(), level) || !l.f.allow(l.scope, time.Now()) {
		return
	}
	l.log.Log(context.Background(), level, msg)
}

func (l *pionLogger) emitf(level slog.Level, format string, args ...any) {
	if !l.log.Enabled(context.Background(), level) || !l.f.allow(l.scope, time.Now()) {
		return
	}
	l.log.Log(context.Background(), level, fmt.Sprintf(format, args...))
}

func (l *pionLogger) Trace(msg string)                  { l.emit(levelTrace, msg) }
func (l *pionLogger) Tracef(format string, args ...any) { l.emitf(levelTrace, format, args...) }
func (l *pionLogger) Debug(msg string)                  { l.emit(slog.LevelDebug, msg) }
func (l *pionLogger) Debugf(format string, args ...any) { l.emitf(slog.LevelDebug, format, args...) }
func (l *pionLogger) Info(msg string)                   { l.emit(slog.LevelDebug, msg) }
func (l *pionLogger) Infof(format string, args ...any)  { l.emitf(slog.LevelDebug, format, args...) }
func (l *pionLogger) Warn(msg string)                   { l.emit(slog.LevelDebug, msg) }
func (l *pionLogger) Warnf(format string, args ...any)  { l.emitf(slog.LevelDebug, format, args...) }
func (l *pionLogger) Error(msg string)                  { l.emit(slog.LevelError, msg) }
func (l *pionLogger) Errorf(format string, args ...any) { l.emitf(slog.LevelError, format, args...) }
