package transceiver

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestPionLogsLevels(t *testing.T) {
	var buf bytes.Buffer
	l := pionLogs{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}.NewLogger("ice")
	l.Tracef("trace %d", 1)
	l.Debug("debug")
	l.Infof("info %d", 2)
	l.Warnf("warn %d", 3)
	l.Error("error")
	out := buf.String()
	if strings.Contains(out, "trace") || strings.Contains(out, "debug") || strings.Contains(out, "info 2") {
		t.Fatalf("below-info Pion lines logged at info:\n%s", out)
	}
	if !strings.Contains(out, `level=WARN msg="warn 3" pion=ice`) || !strings.Contains(out, `level=ERROR msg=error pion=ice`) {
		t.Fatalf("warn and error lines missing or without scope:\n%s", out)
	}
}
