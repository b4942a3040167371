package transceiver

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/switchboard-rtc/switchboard/internal/apm"
)

func TestParseCleaning(t *testing.T) {
	for _, tc := range []struct {
		name      string
		raw       string
		interrupt bool
		want      cleanSetting
		err       bool
	}{
		{"default with interruption", `{"type":"server_vad"}`, true, cleanSetting{echo: defaultEchoCancellation}, false},
		{"default without interruption", `{"type":"server_vad","interrupt_response":false}`, false, cleanSetting{}, false},
		{"off", `{"echo_cancellation":null}`, true, cleanSetting{}, false},
		{"on, backend audio", `{"echo_cancellation":{"backend_audio":true}}`, false, cleanSetting{echo: true, backendAudio: true}, false},
		{"near field", `{"echo_cancellation":null,"noise_reduction":{"type":"near_field"}}`, true, cleanSetting{noise: apm.NearField}, false},
		{"far field and echo", `{"echo_cancellation":{},"noise_reduction":{"type":"far_field"}}`, false, cleanSetting{echo: true, noise: apm.FarField}, false},
		{"guard", `{"echo_cancellation":{"guard_first_reply":true}}`, false, cleanSetting{echo: true, guard: true}, false},
		{"noise null", `{"noise_reduction":null}`, false, cleanSetting{}, false},
		{"bad type", `{"noise_reduction":{"type":"studio"}}`, false, cleanSetting{}, true},
		{"no type", `{"noise_reduction":{}}`, false, cleanSetting{}, true},
		{"echo not an object", `{"echo_cancellation":true}`, false, cleanSetting{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCleaning(json.RawMessage(tc.raw), tc.interrupt)
			if tc.err {
				if !errors.Is(err, apm.ErrConfig) {
					t.Fatalf("err %v, want apm.ErrConfig", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseCleaning(%s) = %+v, %v; want %+v", tc.raw, got, err, tc.want)
			}
		})
	}
}

// TestBridgeDocCleaningExample: the turn_detection example of
// docs/bridge.md §4.8 with cleaning members parses, as printed.
func TestBridgeDocCleaningExample(t *testing.T) {
	f, err := os.Open("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var example string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if l := sc.Text(); strings.HasPrefix(l, "{") && strings.Contains(l, `"noise_reduction"`) {
			example = l
		}
	}
	if example == "" {
		t.Fatal("docs/bridge.md has no turn_detection example with noise_reduction")
	}
	td, err := parseTurnDetection(json.RawMessage(example))
	if err != nil || td == nil {
		t.Fatalf("%s: %v", example, err)
	}
	cs, err := parseCleaning(json.RawMessage(example), td.InterruptResponse)
	if err != nil || !cs.echo || cs.backendAudio || cs.noise != apm.FarField {
		t.Fatalf("%s: %+v, %v", example, cs, err)
	}
}
