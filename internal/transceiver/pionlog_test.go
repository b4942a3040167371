package transceiver

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestPionLogsThroughSlog: Pion's own log lines of a real call come out
// of the transceiver's slog logger, as JSON with the Pion scope.
func TestPionLogsThroughSlog(t *testing.T) {
	var buf logbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: levelTrace}))
	_, api := directServerLog(t, log)
	c := dialLive(t, api, nil)
	waitFor(t, c.dcOpen, 10*time.Second, "the client's data channel")
	scopes := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var line struct {
			Pion string `json:"pion"`
			Msg  string `json:"msg"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line is not JSON: %q", sc.Text())
		}
		if line.Pion != "" {
			scopes[line.Pion]++
		}
	}
	// ICE is answered by internal/peer itself; DTLS and SCTP are Pion's.
	if scopes["dtls"] == 0 || scopes["sctp"] == 0 {
		t.Fatalf("no Pion DTLS or SCTP line in the transceiver's log (Pion scopes seen: %v)", scopes)
	}
}

// TestPionLogLimit: a burst of Pion lines (a flood of bad packets) logs
// at most the burst and counts the rest; Pion's warnings are debug lines.
func TestPionLogLimit(t *testing.T) {
	var buf logbuf.Buffer
	f := newPionLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	l := f.NewLogger("sctp")
	const n = 1000
	for i := range n {
		l.Errorf("failed to handle inbound packet %d", i)
	}
	lines, dropped := strings.Count(buf.String(), "\n"), int(f.Suppressed())
	if lines > pionLogBurst+1 || lines < pionLogBurst || lines+dropped != n {
		t.Fatalf("%d lines logged, %d counted as dropped, of %d; want about %d logged and the rest counted", lines, dropped, n, pionLogBurst)
	}
	f.NewLogger("datachannel").Warn("a warning at the info level is not logged")
	if strings.Contains(buf.String(), `"pion":"datachannel"`) {
		t.Fatal("a Pion warning was logged at the info level")
	}
	f.NewLogger("dtls").Error("another scope has its own budget")
	if !strings.Contains(buf.String(), `"pion":"dtls"`) {
		t.Fatal("a flood in one scope silenced another")
	}
}
