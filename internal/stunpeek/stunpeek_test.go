package stunpeek

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/pion/stun/v4"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type attr struct {
	typ uint16
	val []byte
}

// msg builds a STUN message by hand: header plus attributes, each padded.
func msg(typ uint16, attrs ...attr) []byte {
	b := make([]byte, HeaderLen, 128)
	binary.BigEndian.PutUint16(b[0:2], typ)
	binary.BigEndian.PutUint32(b[4:8], MagicCookie)
	copy(b[8:20], "transaction!")
	for _, a := range attrs {
		b = binary.BigEndian.AppendUint16(b, a.typ)
		b = binary.BigEndian.AppendUint16(b, uint16(len(a.val)))
		b = append(b, a.val...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	binary.BigEndian.PutUint16(b[2:4], uint16(len(b)-HeaderLen))
	return b
}

func user(s string) attr { return attr{AttrUsername, []byte(s)} }

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want Kind
	}{
		{"empty", nil, KindOther},
		{"stun 0", []byte{0}, KindSTUN},
		{"stun 3", []byte{3, 9}, KindSTUN},
		{"4", []byte{4}, KindOther},
		{"zrtp 16", []byte{16}, KindOther},
		{"dtls 20", []byte{20}, KindDTLS},
		{"dtls handshake 22", []byte{22, 0xfe, 0xfd}, KindDTLS},
		{"dtls 63", []byte{63}, KindDTLS},
		{"turn channel 64", []byte{64}, KindOther},
		{"127", []byte{127}, KindOther},
		{"rtp 128", []byte{0x80, 111}, KindRTP},
		{"rtcp 200 is 0x80|..", []byte{0x81, 200}, KindRTP},
		{"191", []byte{191}, KindRTP},
		{"192", []byte{192}, KindOther},
		{"hop magic", []byte{0xF5}, KindOther},
		{"255", []byte{255}, KindOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.b); got != tt.want {
				t.Fatalf("Classify(%v) = %v, want %v", tt.b, got, tt.want)
			}
		})
	}
}

func TestPeekBindingRequest(t *testing.T) {
	good := msg(TypeBindingRequest, attr{0x8022, []byte("soft")}, user("abcd:efgh"), attr{AttrMessageIntegrity, make([]byte, 20)})
	long := strings.Repeat("u", MaxUsernameLen)
	truncAttr := msg(TypeBindingRequest, user("abcd:efgh"))
	binary.BigEndian.PutUint16(truncAttr[22:24], 200) // attribute claims more than the message holds
	oddLen := msg(TypeBindingRequest, user("abcd:efgh"))
	oddLen = append(oddLen, 0)
	binary.BigEndian.PutUint16(oddLen[2:4], uint16(len(oddLen)-HeaderLen))
	badPad := msg(TypeBindingRequest, user("abcd:efg")) // 8 bytes + header 4 = 12
	badPad = append(badPad, 0, 6, 0, 1)                 // USERNAME len 1 with no room for its padding
	binary.BigEndian.PutUint16(badPad[2:4], uint16(len(badPad)-HeaderLen))
	shortTail := msg(TypeBindingRequest, user("abcd:efgh"))
	shortTail = append(shortTail, 0, 0, 0, 0)[:len(shortTail)+4]
	binary.BigEndian.PutUint16(shortTail[2:4], uint16(len(shortTail)-HeaderLen))
	// trailing 4 bytes parse as an attribute header of type 0, length 0: fine.
	withCookie := func(b []byte, c uint32) []byte {
		b = bytes.Clone(b)
		binary.BigEndian.PutUint32(b[4:8], c)
		return b
	}
	withLen := func(b []byte, l uint16) []byte {
		b = bytes.Clone(b)
		binary.BigEndian.PutUint16(b[2:4], l)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want Result
		user string
	}{
		{"good", good, OK, "abcd:efgh"},
		{"only username", msg(TypeBindingRequest, user("a:b")), OK, "a:b"},
		{"empty username", msg(TypeBindingRequest, user("")), OK, ""},
		{"513 bytes", msg(TypeBindingRequest, user(long)), OK, long},
		{"514 bytes", msg(TypeBindingRequest, user(long+"x")), UsernameTooLong, ""},
		{"first username wins", msg(TypeBindingRequest, user("first:1"), user("second:2")), OK, "first:1"},
		{"username after integrity ignored", msg(TypeBindingRequest, attr{AttrMessageIntegrity, make([]byte, 20)}, user("abcd:efgh")), NoUsername, ""},
		{"username after integrity-sha256 ignored", msg(TypeBindingRequest, attr{AttrMessageIntegritySHA256, make([]byte, 32)}, user("abcd:efgh")), NoUsername, ""},
		{"no attributes", msg(TypeBindingRequest), NoUsername, ""},
		{"unknown attrs only", msg(TypeBindingRequest, attr{0x0024, []byte{1, 2, 3, 4}}, attr{0xC057, []byte{1}}), NoUsername, ""},
		{"trailing zero attribute", shortTail, OK, "abcd:efgh"},
		{"binding response", msg(0x0101, user("abcd:efgh")), NotBindingRequest, ""},
		{"binding indication", msg(0x0011), NotBindingRequest, ""},
		{"allocate request", msg(0x0003, user("abcd:efgh")), NotBindingRequest, ""},
		{"nil", nil, Malformed, ""},
		{"19 bytes", good[:19], Malformed, ""},
		{"top bits set", append([]byte{0xC0}, good[1:]...), Malformed, ""},
		{"bad cookie", withCookie(good, 0x2112A443), Malformed, ""},
		{"length not multiple of 4", oddLen, Malformed, ""},
		{"length too big", withLen(good, uint16(len(good)-HeaderLen+4)), Malformed, ""},
		{"length too small", withLen(good, uint16(len(good)-HeaderLen-4)), Malformed, ""},
		{"attribute overruns", truncAttr, Malformed, ""},
		{"padding overruns", badPad, Malformed, ""},
		{"attribute header cut", withLen(append(bytes.Clone(msg(TypeBindingRequest)), 0, 6), 2), Malformed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, r := PeekBindingRequest(tt.b)
			if r != tt.want {
				t.Fatalf("result %v, want %v", r, tt.want)
			}
			if string(u) != tt.user {
				t.Fatalf("username %q, want %q", u, tt.user)
			}
			if r == OK && !within(u, tt.b) {
				t.Fatal("username does not alias the datagram")
			}
			if _, ok := BindingRequestUsername(tt.b); ok != (r == OK) {
				t.Fatalf("BindingRequestUsername ok=%v with result %v", ok, r)
			}
		})
	}
}

// TestPeekPionMessage checks against messages built by an independent STUN
// implementation, with integrity and fingerprint like a browser sends.
func TestPeekPionMessage(t *testing.T) {
	for _, name := range []string{"abcd:efgh", strings.Repeat("A", 32) + ":cl+/", "x:y:z"} {
		m, err := stun.Build(stun.TransactionID, stun.BindingRequest,
			stun.NewUsername(name),
			stun.NewShortTermIntegrity("pwd"),
			stun.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		u, r := PeekBindingRequest(m.Raw)
		if r != OK || string(u) != name {
			t.Fatalf("%q: got %q, %v", name, u, r)
		}
	}
	m, err := stun.Build(stun.TransactionID, stun.BindingSuccess, stun.NewUsername("abcd:efgh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, r := PeekBindingRequest(m.Raw); r != NotBindingRequest {
		t.Fatalf("binding success: %v", r)
	}
}

func TestServerUfrag(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
		ok   bool
	}{
		{"typical", "abcd:efgh", "abcd", true},
		{"token", strings.Repeat("Q", 32) + ":wxyz", strings.Repeat("Q", 32), true},
		{"ice chars", "ab+/:c+/d", "ab+/", true},
		{"several colons", "abcd:ef:gh", "abcd", true},
		{"empty client part", "abcd:", "abcd", true},
		{"256-char ufrag", strings.Repeat("a", 256) + ":b", strings.Repeat("a", 256), true},
		{"513 bytes", strings.Repeat("a", 256) + ":" + strings.Repeat("b", 256), strings.Repeat("a", 256), true},
		{"514 bytes", strings.Repeat("a", 256) + ":" + strings.Repeat("b", 257), "", false},
		{"257-char ufrag", strings.Repeat("a", 257) + ":b", "", false},
		{"3-char ufrag", "abc:efgh", "", false},
		{"no colon", "abcdefgh", "", false},
		{"leading colon", ":abcd", "", false},
		{"empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			got, ok := ServerUfrag(in)
			if ok != tt.ok || string(got) != tt.want {
				t.Fatalf("ServerUfrag(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
			}
			if ok && (!within(got, in) || cap(got) != len(got)) {
				t.Fatal("result must alias the input with capped capacity")
			}
		})
	}
}

func TestAllocatesNothing(t *testing.T) {
	b := msg(TypeBindingRequest, attr{0x8022, []byte("software")}, user(strings.Repeat("A", 32)+":abcd"), attr{AttrMessageIntegrity, make([]byte, 20)}, attr{0x8028, make([]byte, 4)})
	n := testing.AllocsPerRun(1000, func() {
		_ = Classify(b)
		u, _ := PeekBindingRequest(b)
		_, _ = ServerUfrag(u)
	})
	if n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}

// within reports whether sub is a subslice of b (by address), or empty.
func within(sub, b []byte) bool {
	if len(sub) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	// Compare addresses via the full-capacity view of b.
	full := b[:cap(b)]
	for i := 0; i+len(sub) <= len(b); i++ {
		if &full[i] == &sub[0] {
			return true
		}
	}
	return false
}

func FuzzBindingRequestUsername(f *testing.F) {
	f.Add(msg(TypeBindingRequest, user("abcd:efgh"), attr{AttrMessageIntegrity, make([]byte, 20)}))
	f.Add(msg(TypeBindingRequest, user(strings.Repeat("A", 32)+":x")))
	f.Add(msg(TypeBindingRequest))
	f.Add(msg(0x0101, user("abcd:efgh")))
	f.Add(msg(TypeBindingRequest, user(strings.Repeat("u", 514))))
	f.Add([]byte{0, 1, 0, 4, 0x21, 0x12, 0xA4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 6, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		u, r := PeekBindingRequest(b)
		if r != OK {
			if u != nil {
				t.Fatalf("non-nil username with %v", r)
			}
			return
		}
		if len(u) > MaxUsernameLen || !within(u, b) {
			t.Fatalf("username %d bytes not inside the datagram", len(u))
		}
		if len(b) < HeaderLen || (len(b)-HeaderLen)%4 != 0 {
			t.Fatal("accepted a datagram with a bad length")
		}
		if s, ok := ServerUfrag(u); ok {
			if len(s) < MinUfragLen || len(s) > MaxUfragLen || bytes.IndexByte(s, ':') >= 0 || !within(s, b) {
				t.Fatalf("bad server ufrag %q", s)
			}
		}
	})
}

func FuzzClassify(f *testing.F) {
	for _, c := range []byte{0, 3, 4, 19, 20, 22, 63, 64, 127, 128, 191, 192, 0xF5, 255} {
		f.Add([]byte{c, 1, 2})
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		k := Classify(b)
		if len(b) == 0 {
			if k != KindOther {
				t.Fatal("empty datagram must be other")
			}
			return
		}
		c := b[0]
		want := KindOther
		switch {
		case c < 4:
			want = KindSTUN
		case c >= 20 && c < 64:
			want = KindDTLS
		case c >= 128 && c < 192:
			want = KindRTP
		}
		if k != want {
			t.Fatalf("Classify(%d) = %v, want %v", c, k, want)
		}
		if k != KindSTUN {
			if _, r := PeekBindingRequest(b); r == OK {
				t.Fatal("a non-STUN first byte passed as a Binding request")
			}
		}
	})
}

func BenchmarkPeek(b *testing.B) {
	m := msg(TypeBindingRequest, attr{0x8022, []byte("software")}, attr{0x0024, make([]byte, 4)}, user(strings.Repeat("A", 32)+":abcd"), attr{AttrMessageIntegrity, make([]byte, 20)}, attr{0x8028, make([]byte, 4)})
	b.ReportAllocs()
	for b.Loop() {
		u, _ := PeekBindingRequest(m)
		_, _ = ServerUfrag(u)
	}
}
