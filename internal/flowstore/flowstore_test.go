package flowstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/redistest"
)

func TestMain(m *testing.M) {
	LogRedisTo(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}

func TestKey(t *testing.T) {
	r := NewWithClient(nil, 3)
	for _, tt := range []struct{ name, in, want string }{
		{"ipv4", "198.51.100.1:50000", "switchboard:{3}:flow:198.51.100.1:50000"},
		{"ipv6", "[2001:db8::2]:50001", "switchboard:{3}:flow:[2001:db8::2]:50001"},
		{"v4-mapped is unmapped", "[::ffff:198.51.100.1]:50000", "switchboard:{3}:flow:198.51.100.1:50000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Key(netip.MustParseAddrPort(tt.in)); got != tt.want {
				t.Fatalf("Key(%s) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestKeyStyle: flow keys share the membership registry's style and
// Redis Cluster hash tag, so one cluster's registry and flows live on one
// node.
func TestKeyStyle(t *testing.T) {
	members, addrs := membership.RedisKeys(3)
	flow := NewWithClient(nil, 3).Key(netip.MustParseAddrPort("198.51.100.1:50000"))
	tag := func(k string) string {
		i := strings.IndexByte(k, '{')
		j := strings.IndexByte(k, '}')
		if i < 0 || j < i {
			t.Fatalf("key %q has no hash tag", k)
		}
		return k[:j+1]
	}
	if tag(flow) != tag(members) || tag(flow) != tag(addrs) || tag(flow) != "switchboard:{3}" {
		t.Errorf("keys %q, %q, %q do not share one prefix and hash tag", flow, members, addrs)
	}
}

// TestPutGet writes a batch, reads it back with one with gaps, checks the
// TTL and the cluster namespace, and deletes.
func TestPutGet(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c3, err := New(srv.Addr, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	c4, _ := New(srv.Addr, 4)
	defer c4.Close()

	var clients []netip.AddrPort
	var values [][]byte
	for i := range 100 {
		clients = append(clients, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 5000))
		values = append(values, fmt.Appendf(nil, "1 10.1.0.1:4000 %d -", i))
	}
	if err := c3.Put(ctx, clients, values, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	ask := []netip.AddrPort{clients[0], netip.MustParseAddrPort("192.0.2.1:1"), clients[99]}
	got := make([][]byte, len(ask))
	if err := c3.Get(ctx, ask, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[0], values[0]) || got[1] != nil || !bytes.Equal(got[2], values[99]) {
		t.Fatalf("got %q", got)
	}
	if err := c4.Get(ctx, ask, got); err != nil || got[0] != nil || got[2] != nil {
		t.Fatalf("another cluster sees %q (%v)", got, err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	if ttl := rc.PTTL(ctx, c3.Key(clients[5])).Val(); ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("TTL %v, want (0, 2s]", ttl)
	}
	if err := c3.Get(ctx, ask, got[:1]); err != ErrBadBatch {
		t.Fatalf("mismatched lengths: %v", err)
	}
}

// TestDown: against a closed port, calls fail fast with an error.
func TestDown(t *testing.T) {
	c, err := New(fmt.Sprintf("127.0.0.1:%d", redistest.ClosedPort(t)), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	got := make([][]byte, 1)
	if err := c.Get(context.Background(), []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1")}, got); err == nil {
		t.Fatal("Get against a closed port worked")
	}
	if err := c.Put(context.Background(), []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1")}, [][]byte{[]byte("x")}, time.Second); err == nil {
		t.Fatal("Put against a closed port worked")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("failing took %v", d)
	}
}

// TestURL: a Redis with a password is usable through a redis:// URL (and
// not through host:port); rediss:// turns TLS on; host:port still works;
// bad addresses say what to write instead and never echo the password.
func TestURL(t *testing.T) {
	srv := redistest.StartArgs(t, "--requirepass", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := []netip.AddrPort{netip.MustParseAddrPort("198.51.100.1:50000")}
	put := func(addr string) error {
		t.Helper()
		c, err := New(addr, 3)
		if err != nil {
			t.Fatalf("New(%q): %v", addr, err)
		}
		defer c.Close()
		return c.Put(ctx, client, [][]byte{[]byte("v")}, time.Minute)
	}
	if err := put(srv.Addr); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("host:port to a Redis with a password: %v, want NOAUTH", err)
	}
	for _, u := range []string{"redis://:s3cret@" + srv.Addr, "redis://default:s3cret@" + srv.Addr + "/0"} {
		if err := put(u); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
	}
	if err := put("redis://:wrong@" + srv.Addr); err == nil {
		t.Fatal("a wrong password worked")
	}
	// host:port still works where there is no password.
	open := redistest.Start(t)
	if err := put(open.Addr); err != nil {
		t.Fatal(err)
	}

	// rediss:// is TLS, verified against the host; redis:// and host:port are not.
	for _, tt := range []struct {
		addr, host string
		tls        bool
	}{
		{"rediss://:pw@redis.example:6380/2", "redis.example:6380", true},
		{"redis://redis.example", "redis.example:6379", false},
		{"redis.example:6379", "redis.example:6379", false},
		{"[2001:db8::1]:6379", "[2001:db8::1]:6379", false},
	} {
		c, err := New(tt.addr, 3)
		if err != nil {
			t.Fatalf("New(%q): %v", tt.addr, err)
		}
		o := c.client.Options()
		if o.Addr != tt.host || (o.TLSConfig != nil) != tt.tls || o.MaxRetries != 0 || o.ReadTimeout != ioTimeout {
			t.Fatalf("New(%q): addr %s, TLS %v, retries %d (want 0: none), read timeout %v", tt.addr, o.Addr, o.TLSConfig != nil, o.MaxRetries, o.ReadTimeout)
		}
		if tt.tls && o.TLSConfig.ServerName != "redis.example" {
			t.Fatalf("TLS server name %q", o.TLSConfig.ServerName)
		}
		c.Close()
	}

	for _, tt := range []struct{ addr, says string }{
		{"", "empty"},
		{"redis.example", "not host:port"},
		{"redis.example:", "not host:port"},
		{"redis.example:http", "port"},
		{"http://:pw-secret@redis.example:6379", `scheme "http"`},
		{"redis://:pw-secret@redis.example:6379/x", "invalid database number"},
		{"redis://:pw-secret@:6379", "no host"},
		{"redis://:pw-secret@redis.example:6379/0?nope=1", "nope"},
		{"redis://:pw-secret@redis.example:99999999", "port"},
		{"redis://:pw-secret@redis example:6379", "does not parse"},
		{"redis.example:0", "port"},
		// Not URLs, or URLs whose password is not where it belongs:
		// nothing of the address is echoed (the parser's reasons quote
		// pieces of it).
		{"redis:/:pw-secret@redis.example:6379", "percent-encode"},
		{"redis//:pw-secret@redis.example:6379", "percent-encode"},
		{":pw-secret@redis.example:6379", "percent-encode"},
		{"pw-secret@redis.example:6379", "percent-encode"},
		{"redis://:pw-secret/x@redis.example:6379", "percent-encode"},
		{"redis://user:pw-secret#x@redis.example:6379", "percent-encode"},
		{"redis://user:pw-secret?x@redis.example:6379", "percent-encode"},
		{"redis://:pw-secret%zz@redis.example:6379", "percent-encode"},
		{"redis://:%zzpw-secret@redis.example:6379", "percent-encode"},
		{"redis://u:6379/pw-secret@redis.example:6379", "percent-encode"},
		{"redis://pw-secret@redis.example:6379/x", "invalid database number"},
		{"http://pw-secret@redis.example:6379", `scheme "http"`},
	} {
		_, err := New(tt.addr, 3)
		if err == nil || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), "rediss://") || strings.Contains(err.Error(), "pw-secret") || strings.Contains(err.Error(), "%zz") {
			t.Errorf("New(%q) = %v; want an error saying %q and what to write, without the password", tt.addr, err, tt.says)
		}
	}
}
