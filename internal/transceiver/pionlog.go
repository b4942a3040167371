package transceiver

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/pion/logging"
)

// pionLogs routes Pion's logs into the transceiver's slog logger, with the
// Pion scope ("ice", "dtls", "sctp", ...) as attribute "pion". Pion's
// Trace and Debug go to slog Debug, its Info too (per-packet-path and
// state-machine detail a fleet does not want at info), Warn and Error as
// they are. One factory serves every session: Pion's default builds one
// per API (one per session here), reading the PION_LOG_* environment
// variables each time, and writes to stdout beside our structured logs.
type pionLogs struct{ log *slog.Logger }

// NewLogger implements logging.LoggerFactory. It allocates only the small
// adapter; the scope attribute is added when a line is logged.
func (f pionLogs) NewLogger(scope string) logging.LeveledLogger {
	return &pionLogger{log: f.log, scope: scope}
}

type pionLogger struct {
	log   *slog.Logger
	scope string
}

func (l *pionLogger) emit(level slog.Level, msg string) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	l.log.Log(ctx, level, msg, "pion", l.scope)
}

func (l *pionLogger) emitf(level slog.Level, format string, args ...any) {
	if !l.log.Enabled(context.Background(), level) {
		return // no formatting for discarded lines
	}
	l.emit(level, fmt.Sprintf(format, args...))
}

func (l *pionLogger) Trace(msg string)                  { l.emit(slog.LevelDebug-4, msg) }
func (l *pionLogger) Tracef(format string, args ...any) { l.emitf(slog.LevelDebug-4, format, args...) }
func (l *pionLogger) Debug(msg string)                  { l.emit(slog.LevelDebug, msg) }
func (l *pionLogger) Debugf(format string, args ...any) { l.emitf(slog.LevelDebug, format, args...) }
func (l *pionLogger) Info(msg string)                   { l.emit(slog.LevelDebug, msg) }
func (l *pionLogger) Infof(format string, args ...any)  { l.emitf(slog.LevelDebug, format, args...) }
func (l *pionLogger) Warn(msg string)                   { l.emit(slog.LevelWarn, msg) }
func (l *pionLogger) Warnf(format string, args ...any)  { l.emitf(slog.LevelWarn, format, args...) }
func (l *pionLogger) Error(msg string)                  { l.emit(slog.LevelError, msg) }
func (l *pionLogger) Errorf(format string, args ...any) { l.emitf(slog.LevelError, format, args...) }
