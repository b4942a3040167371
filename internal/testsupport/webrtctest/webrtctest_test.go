package webrtctest

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAudioOffer(t *testing.T) {
	tests := []struct {
		name          string
		audio, events bool
		want, notWant []string
	}{
		{"audio and events", true, true, []string{"m=audio", "m=application", "a=candidate:", "a=end-of-candidates"}, nil},
		{"events only", false, true, []string{"m=application", "a=candidate:"}, []string{"m=audio"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sdp := AudioOffer(t, tt.audio, tt.events)
			for _, w := range tt.want {
				if !strings.Contains(sdp, w) {
					t.Errorf("offer lacks %q", w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(sdp, w) {
					t.Errorf("offer has %q", w)
				}
			}
		})
	}
}
