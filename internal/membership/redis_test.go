package membership

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/redistest"
)

// startRedis runs a real redis-server on a free loopback port for the test
// (skipped without one, except in CI) and returns its address and a stop
// that kills it, as a crash would.
func startRedis(t *testing.T) (addr string, stop func()) {
	t.Helper()
	s := redistest.Start(t)
	return s.Addr, s.Stop
}

func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRedisRegistry(t *testing.T) {
	addr, _ := startRedis(t)
	ctx := context.Background()
	trxClient, relayClient := newClient(t, addr), newClient(t, addr)
	a1, a2 := netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.0.0.2:4000")

	r1, err := RegisterRedis(ctx, trxClient, 7, 1, a1, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := RegisterRedis(ctx, trxClient, 7, 2, a2, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := RegisterRedis(ctx, trxClient, 8, 3, a2, 50*time.Millisecond, nil) // another cluster
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	var table Table
	w, err := WatchRedis(ctx, relayClient, 7, &table, 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got, ok := table.Lookup(1); !ok || got != a1 {
		t.Fatalf("after the first read: id 1 → %v %v", got, ok)
	}
	if _, ok := table.Lookup(3); ok {
		t.Fatal("a transceiver of another cluster is in the table")
	}

	// A clean deregistration leaves at once.
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "id 1 to leave after Close", func() bool { _, ok := table.Lookup(1); return !ok })

	// A transceiver that stops heartbeating (crash: no Close) leaves after
	// its TTL, 3 heartbeats. Simulate it by stopping the heartbeat loop
	// without the deregistration.
	r2.cancel()
	r2.wg.Wait()
	start := time.Now()
	waitFor(t, "id 2 to expire", func() bool { _, ok := table.Lookup(2); return !ok })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("id 2 left %v after its last heartbeat, bound is 150 ms + a poll", d)
	}
}

func TestRedisDownKeepsTable(t *testing.T) {
	// Registered first, so it runs after the clients are closed: go-redis
	// redials a dead server from a goroutine that notices the pool closed
	// only after its 1 s retry sleep; let it go before goleak looks.
	t.Cleanup(func() { time.Sleep(1200 * time.Millisecond) })
	addr, stop := startRedis(t)
	ctx := context.Background()
	client := newClient(t, addr)
	a := netip.MustParseAddrPort("10.0.0.9:4000")
	reg, err := RegisterRedis(ctx, client, 1, 9, a, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	var table Table
	w, err := WatchRedis(ctx, newClient(t, addr), 1, &table, 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	stop() // Redis dies
	waitFor(t, "failed reads to be counted", func() bool { return w.Failures.Load() >= 3 })
	if got, ok := table.Lookup(9); !ok || got != a {
		t.Fatalf("the table lost id 9 while Redis was down: %v %v", got, ok)
	}
	if reg.Failures.Load() == 0 {
		waitFor(t, "failed heartbeats to be counted", func() bool { return reg.Failures.Load() > 0 })
	}
}

func TestRegisterRedisRejectsBadAddress(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := RegisterRedis(context.Background(), c, 1, 1, netip.MustParseAddrPort("0.0.0.0:4000"), 0, nil); err == nil {
		t.Fatal("an unspecified address was accepted")
	}
}

// TestRedisEmptyReadNeedsConfirmation: one read that finds nobody (an
// empty replica after a failover, a flush) keeps the table; a second one
// in a row empties it.
func TestRedisEmptyReadNeedsConfirmation(t *testing.T) {
	addr, _ := startRedis(t)
	ctx := context.Background()
	client := newClient(t, addr)
	reg, err := RegisterRedis(ctx, client, 3, 5, netip.MustParseAddrPort("10.0.0.5:4000"), time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	var table Table
	w, err := WatchRedis(ctx, client, 3, &table, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if table.Len() != 1 {
		t.Fatalf("%d members, want 1", table.Len())
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	for i, want := range []int{1, 0} {
		if err := w.read(ctx, client, 3, &table, log); err != nil {
			t.Fatal(err)
		}
		if table.Len() != want {
			t.Fatalf("after empty read %d: %d members, want %d", i+1, table.Len(), want)
		}
	}
}
