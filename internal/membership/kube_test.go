package membership

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	testNS  = "voice"
	testSvc = "sb-transceiver-hop"
)

// ep is a compact endpoint description for tests.
type ep struct {
	host        string
	addr        string
	ready       *bool // nil: condition unknown
	terminating bool
}

func ptr[T any](v T) *T { return &v }

func slice(name, svc string, family discoveryv1.AddressType, portName string, port int32, proto corev1.Protocol, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: testNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(portName), Port: ptr(port), Protocol: ptr(proto)}},
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{
			Addresses:  []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.ready, Terminating: ptr(e.terminating)},
		}
		if e.host != "" {
			d.Hostname = ptr(e.host)
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	return es
}

func hopSlice(name string, eps ...ep) *discoveryv1.EndpointSlice {
	return slice(name, testSvc, discoveryv1.AddressTypeIPv4, DefaultKubePortName, 4000, corev1.ProtocolUDP, eps...)
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

func TestIDFromHostname(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		offset  uint32
		want    uint32
		wantErr string
	}{
		{"ordinal", "switchboard-transceiver-3", 0, 3, ""},
		{"offset", "switchboard-transceiver-3", 1, 4, ""},
		{"big offset", "sb-trx-0", 1000, 1000, ""},
		{"max", "t-4294967294", 1, 4294967295, ""},
		{"zero id", "switchboard-transceiver-0", 0, 0, "not a transceiver id"},
		{"overflow", "t-4294967295", 1, 0, "not a transceiver id"},
		{"no dash", "transceiver", 0, 0, "no -<ordinal> suffix"},
		{"trailing dash", "transceiver-", 0, 0, "no -<ordinal> suffix"},
		{"not a number", "switchboard-transceiver-abc", 0, 0, "not a decimal number"},
		{"double dash", "t--1", 5, 6, ""},
		{"suffix not digits", "t-1x", 0, 0, "not a decimal number"},
		{"plus sign", "t-+1", 0, 0, "not a decimal number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IDFromHostname(tt.host, tt.offset)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("IDFromHostname(%q, %d) = %d, %v; want %d", tt.host, tt.offset, got, err, tt.want)
			}
		})
	}
}

func TestKubeEntries(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		name        string
		slices      []*discoveryv1.EndpointSlice
		offset      uint32
		want        map[uint32]netip.AddrPort
		wantSkipped []string // substrings of "endpoint: reason", in order
	}{
		{
			name:   "ready endpoints",
			slices: []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "10.1.0.5", yes, false}, ep{"sb-transceiver-2", "10.1.0.6", yes, false})},
			want:   map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000"), 2: ap("10.1.0.6:4000")},
		},
		{
			name:   "unknown readiness counts as ready",
			slices: []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "10.1.0.5", nil, false})},
			want:   map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")},
		},
		{
			name:        "not ready excluded",
			slices:      []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "10.1.0.5", no, false}, ep{"sb-transceiver-2", "10.1.0.6", yes, false})},
			want:        map[uint32]netip.AddrPort{2: ap("10.1.0.6:4000")},
			wantSkipped: []string{"sb-transceiver-1: not ready"},
		},
		{
			name:   "terminating kept while it drains",
			slices: []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "10.1.0.5", no, true})},
			want:   map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")},
		},
		{
			name:   "offset",
			slices: []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-0", "10.1.0.5", yes, false})},
			offset: 1,
			want:   map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")},
		},
		{
			name:        "ordinal 0 without offset is no id",
			slices:      []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-0", "10.1.0.5", yes, false})},
			want:        map[uint32]netip.AddrPort{},
			wantSkipped: []string{"sb-transceiver-0: membership: invalid entry"},
		},
		{
			name:        "no hostname and no pod name",
			slices:      []*discoveryv1.EndpointSlice{hopSlice("a", ep{"", "10.1.0.5", yes, false})},
			want:        map[uint32]netip.AddrPort{},
			wantSkipped: []string{"10.1.0.5: membership: invalid entry"},
		},
		{
			name: "port by name only",
			slices: []*discoveryv1.EndpointSlice{
				slice("a", testSvc, discoveryv1.AddressTypeIPv4, "signaling", 8080, corev1.ProtocolUDP, ep{"sb-transceiver-1", "10.1.0.5", yes, false}),
				slice("b", testSvc, discoveryv1.AddressTypeIPv4, DefaultKubePortName, 4000, corev1.ProtocolTCP, ep{"sb-transceiver-2", "10.1.0.6", yes, false}),
			},
			want:        map[uint32]netip.AddrPort{},
			wantSkipped: []string{`a: EndpointSlice has no UDP port named "hop"`, `b: EndpointSlice has no UDP port named "hop"`},
		},
		{
			name:   "IPv6",
			slices: []*discoveryv1.EndpointSlice{slice("a", testSvc, discoveryv1.AddressTypeIPv6, DefaultKubePortName, 4000, corev1.ProtocolUDP, ep{"sb-transceiver-1", "fd00::5", yes, false})},
			want:   map[uint32]netip.AddrPort{1: ap("[fd00::5]:4000")},
		},
		{
			name: "dual stack prefers IPv4 whatever the order",
			slices: []*discoveryv1.EndpointSlice{
				slice("v6", testSvc, discoveryv1.AddressTypeIPv6, DefaultKubePortName, 4000, corev1.ProtocolUDP, ep{"sb-transceiver-1", "fd00::5", yes, false}),
				hopSlice("v4", ep{"sb-transceiver-1", "10.1.0.5", yes, false}),
			},
			want: map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")},
		},
		{
			name: "ready beats terminating for one id",
			slices: []*discoveryv1.EndpointSlice{
				hopSlice("a", ep{"sb-transceiver-1", "10.1.0.5", no, true}),
				hopSlice("b", ep{"sb-transceiver-1", "10.1.0.9", yes, false}),
			},
			want: map[uint32]netip.AddrPort{1: ap("10.1.0.9:4000")},
		},
		{
			name: "FQDN slices ignored",
			slices: []*discoveryv1.EndpointSlice{
				slice("a", testSvc, discoveryv1.AddressTypeFQDN, DefaultKubePortName, 4000, corev1.ProtocolUDP, ep{"sb-transceiver-1", "evil.example.com", yes, false}),
			},
			want: map[uint32]netip.AddrPort{},
		},
		{
			name:        "bad and unspecified addresses skipped",
			slices:      []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "not-an-ip", yes, false}, ep{"sb-transceiver-2", "0.0.0.0", yes, false}, ep{"sb-transceiver-3", "fe80::1%eth0", yes, false})},
			want:        map[uint32]netip.AddrPort{},
			wantSkipped: []string{`sb-transceiver-1: address "not-an-ip" is not an IP`, "sb-transceiver-2: unspecified address", `sb-transceiver-3: address "fe80::1%eth0" is not an IP`},
		},
		{
			name:   "mapped IPv6 canonicalized",
			slices: []*discoveryv1.EndpointSlice{hopSlice("a", ep{"sb-transceiver-1", "::ffff:10.1.0.5", yes, false})},
			want:   map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped := KubeEntries(tt.slices, DefaultKubePortName, tt.offset)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("entries = %v, want %v", got, tt.want)
			}
			if len(skipped) != len(tt.wantSkipped) {
				t.Fatalf("skipped = %v, want %d matching %q", skipped, len(tt.wantSkipped), tt.wantSkipped)
			}
			for i, s := range skipped {
				if got := s.Endpoint + ": " + s.Reason; !strings.Contains(got, tt.wantSkipped[i]) {
					t.Errorf("skipped[%d] = %q, want it to contain %q", i, got, tt.wantSkipped[i])
				}
			}
		})
	}
}

func TestKubeEntriesTargetRef(t *testing.T) {
	es := hopSlice("a", ep{"", "10.1.0.5", yes, false})
	es.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: "sb-transceiver-7", Namespace: testNS}
	got, _ := KubeEntries([]*discoveryv1.EndpointSlice{es}, DefaultKubePortName, 0)
	if got[7] != netip.MustParseAddrPort("10.1.0.5:4000") || len(got) != 1 {
		t.Fatalf("got %v, want 7=10.1.0.5:4000 from the pod name", got)
	}
}

// waitTable polls until tab holds want, or fails after a few seconds.
func waitTable(t *testing.T, tab *Table, want map[uint32]netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := tab.Entries()
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("table = %v, want %v", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWatchKube(t *testing.T) {
	ctx := t.Context()
	ap := netip.MustParseAddrPort
	// One slice exists before the watch starts; another Service's slice and
	// a slice in another namespace must never show up.
	client := fake.NewClientset(
		hopSlice("hop-a", ep{"sb-transceiver-1", "10.1.0.5", yes, false}),
		slice("other", "other-svc", discoveryv1.AddressTypeIPv4, DefaultKubePortName, 4000, corev1.ProtocolUDP, ep{"sb-transceiver-9", "10.9.9.9", yes, false}),
	)
	foreign := hopSlice("foreign", ep{"sb-transceiver-8", "10.8.8.8", yes, false})
	foreign.Namespace = "elsewhere"
	if _, err := client.DiscoveryV1().EndpointSlices("elsewhere").Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tab := new(Table)
	k, err := WatchKube(KubeConfig{Client: client, Namespace: testNS, Service: testSvc}, tab)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := k.WaitSynced(sctx); err != nil {
		t.Fatal(err)
	}
	// After WaitSynced the initial membership is in place, without polling.
	if got := tab.Entries(); fmt.Sprint(got) != fmt.Sprint(map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000")}) {
		t.Fatalf("after sync: %v", got)
	}

	slices := client.DiscoveryV1().EndpointSlices(testNS)
	steps := []struct {
		name string
		do   func() error
		want map[uint32]netip.AddrPort
	}{
		{"add a slice", func() error {
			_, err := slices.Create(ctx, hopSlice("hop-b", ep{"sb-transceiver-2", "10.1.0.6", yes, false}, ep{"sb-transceiver-3", "10.1.0.7", no, false}), metav1.CreateOptions{})
			return err
		}, map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000"), 2: ap("10.1.0.6:4000")}},
		{"not-ready endpoint becomes ready", func() error {
			_, err := slices.Update(ctx, hopSlice("hop-b", ep{"sb-transceiver-2", "10.1.0.6", yes, false}, ep{"sb-transceiver-3", "10.1.0.7", yes, false}), metav1.UpdateOptions{})
			return err
		}, map[uint32]netip.AddrPort{1: ap("10.1.0.5:4000"), 2: ap("10.1.0.6:4000"), 3: ap("10.1.0.7:4000")}},
		{"pod restarted with a new IP", func() error {
			_, err := slices.Update(ctx, hopSlice("hop-a", ep{"sb-transceiver-1", "10.1.0.50", yes, false}), metav1.UpdateOptions{})
			return err
		}, map[uint32]netip.AddrPort{1: ap("10.1.0.50:4000"), 2: ap("10.1.0.6:4000"), 3: ap("10.1.0.7:4000")}},
		{"terminating endpoint stays, failing one leaves", func() error {
			_, err := slices.Update(ctx, hopSlice("hop-b", ep{"sb-transceiver-2", "10.1.0.6", no, true}, ep{"sb-transceiver-3", "10.1.0.7", no, false}), metav1.UpdateOptions{})
			return err
		}, map[uint32]netip.AddrPort{1: ap("10.1.0.50:4000"), 2: ap("10.1.0.6:4000")}},
		{"endpoint removed", func() error {
			_, err := slices.Update(ctx, hopSlice("hop-b"), metav1.UpdateOptions{})
			return err
		}, map[uint32]netip.AddrPort{1: ap("10.1.0.50:4000")}},
		{"slice deleted", func() error {
			return slices.Delete(ctx, "hop-a", metav1.DeleteOptions{})
		}, map[uint32]netip.AddrPort{}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.do(); err != nil {
				t.Fatal(err)
			}
			waitTable(t, tab, st.want)
		})
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := k.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	// After Close the table keeps its last membership and no longer changes.
	if _, err := slices.Create(ctx, hopSlice("hop-c", ep{"sb-transceiver-4", "10.1.0.8", yes, false}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if tab.Len() != 0 {
		t.Fatalf("table changed after Close: %v", tab.Entries())
	}
}

func TestWatchKubeConfig(t *testing.T) {
	client := fake.NewClientset()
	tests := []struct {
		name    string
		cfg     KubeConfig
		wantErr string
	}{
		{"no client", KubeConfig{Namespace: "a", Service: "b"}, "no Kubernetes client"},
		{"no namespace", KubeConfig{Client: client, Service: "b"}, "namespace is empty"},
		{"no service", KubeConfig{Client: client, Namespace: "a"}, "service is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := WatchKube(tt.cfg, new(Table))
			if !errors.Is(err, ErrKubeConfig) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if _, err := WatchKube(KubeConfig{Client: client, Namespace: "a", Service: "b"}, nil); !errors.Is(err, ErrKubeConfig) {
		t.Fatalf("nil table: err = %v", err)
	}
}

func TestWaitSyncedTimeout(t *testing.T) {
	// A client whose list never succeeds keeps the source unsynced.
	client := fake.NewClientset()
	client.PrependReactor("list", "endpointslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	k, err := WatchKube(KubeConfig{Client: client, Namespace: testNS, Service: testSvc}, new(Table))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := k.WaitSynced(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), testNS+"/"+testSvc) {
		t.Fatalf("err = %v", err)
	}
}
