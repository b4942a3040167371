package membership

// The Redis membership registry.
//
// Transceivers register themselves and heartbeat; relays poll the registry
// in the background and Set their Table from it. Nothing on the packet path
// touches Redis. Keys, per cluster:
//
//	switchboard:{<cluster>}:members        sorted set: member = transceiver id (decimal),
//	                                       score = expiry, Unix milliseconds
//	switchboard:{<cluster>}:member_addrs   hash: transceiver id → internal hop ip:port
//
// A heartbeat is one MULTI: ZADD with the new expiry and HSET of the
// address. A transceiver that stops heartbeating drops out of the table once
// its expiry passes (RedisTTL after its last heartbeat, 6 s by default); the
// next heartbeat from a restarted one brings it back. Expiries are on the
// Redis server's clock (TIME), never a host's. Relays read with
// ZRANGEBYSCORE (expiry ≥ now) and HMGET and never write: an expired
// member's entries stay, ignored, until its id registers again. If
// Redis is unreachable, relays keep the last table they read, count the
// failure and log it at most once per LogEvery.

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of the Redis registry.
const (
	DefaultRedisHeartbeat = 2 * time.Second
	DefaultRedisTTL       = 3 * DefaultRedisHeartbeat
	DefaultRedisPoll      = time.Second
)

// RedisKeys returns the registry's keys for a cluster: the sorted set of
// member expiries and the hash of member addresses. The braces make both
// keys hash to one Redis Cluster slot, so a heartbeat is one MULTI.
func RedisKeys(cluster uint16) (members, addrs string) {
	p := "switchboard:{" + strconv.Itoa(int(cluster)) + "}:"
	return p + "members", p + "member_addrs"
}

// RedisRegistration keeps one transceiver registered until Close.
type RedisRegistration struct {
	client  redis.UniversalClient
	cluster uint16
	id      uint32
	addr    netip.AddrPort
	ttl     time.Duration
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
	// Failures counts heartbeats that did not reach Redis.
	Failures atomic.Uint64
}

// RegisterRedis registers transceiver id of cluster at addr (its internal
// hop address) and heartbeats every interval (0: DefaultRedisHeartbeat)
// with an expiry of 3 intervals. The first heartbeat is sent before it
// returns; its error is returned, but the registration keeps retrying in
// the background either way. Close deregisters.
func RegisterRedis(ctx context.Context, client redis.UniversalClient, cluster uint16, id uint32, addr netip.AddrPort, interval time.Duration, log *slog.Logger) (*RedisRegistration, error) {
	if interval <= 0 {
		interval = DefaultRedisHeartbeat
	}
	if log == nil {
		log = slog.Default()
	}
	if !addr.IsValid() || addr.Port() == 0 || addr.Addr().IsUnspecified() {
		return nil, fmt.Errorf("membership: redis: %s is not an address relays can send to", addr)
	}
	r := &RedisRegistration{client: client, cluster: cluster, id: id, addr: addr, ttl: 3 * interval}
	bctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	err := r.beat(ctx)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		var lastLog time.Time
		for {
			select {
			case <-bctx.Done():
				return
			case <-t.C:
				if err := r.beat(bctx); err != nil && bctx.Err() == nil {
					if time.Since(lastLog) > 30*time.Second {
						log.Warn("membership heartbeat to redis failed", "err", err, "failures", r.Failures.Load())
						lastLog = time.Now()
					}
				}
			}
		}
	}()
	return r, err
}

func (r *RedisRegistration) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.ttl/3)
	defer cancel()
	members, addrs := RedisKeys(r.cluster)
	id := strconv.FormatUint(uint64(r.id), 10)
	// Expiries are on Redis's clock, which every relay reads too, so that
	// clock skew between hosts cannot expire live members.
	now, err := r.client.Time(ctx).Result()
	if err != nil {
		r.Failures.Add(1)
		return err
	}
	expiry := float64(now.Add(r.ttl).UnixMilli())
	_, err = r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, members, redis.Z{Score: expiry, Member: id})
		p.HSet(ctx, addrs, id, r.addr.String())
		return nil
	})
	if err != nil {
		r.Failures.Add(1)
	}
	return err
}

// Close stops heartbeating and removes the registration (best effort, 1 s).
func (r *RedisRegistration) Close() error {
	var err error
	r.once.Do(func() {
		r.cancel()
		r.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		members, addrs := RedisKeys(r.cluster)
		id := strconv.FormatUint(uint64(r.id), 10)
		_, err = r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.ZRem(ctx, members, id)
			p.HDel(ctx, addrs, id)
			return nil
		})
	})
	return err
}

// RedisWatcher keeps a Table equal to a cluster's live registry members.
type RedisWatcher struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	// Polls and Failures count registry reads and the ones that failed
	// (Redis unreachable, or an entry that does not parse: it is skipped).
	Polls, Failures atomic.Uint64
	emptyOnce       atomic.Bool // the last read found no member
}

// WatchRedis reads the registry of cluster every poll (0: DefaultRedisPoll)
// into t. It reads once before returning and returns that read's error;
// the table is left as it was on errors, and reads continue in the
// background until Close.
func WatchRedis(ctx context.Context, client redis.UniversalClient, cluster uint16, t *Table, poll time.Duration, log *slog.Logger) (*RedisWatcher, error) {
	if poll <= 0 {
		poll = DefaultRedisPoll
	}
	if log == nil {
		log = slog.Default()
	}
	w := &RedisWatcher{}
	bctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	err := w.read(ctx, client, cluster, t, log)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tk := time.NewTicker(poll)
		defer tk.Stop()
		var lastLog time.Time
		for {
			select {
			case <-bctx.Done():
				return
			case <-tk.C:
				if err := w.read(bctx, client, cluster, t, log); err != nil && bctx.Err() == nil && time.Since(lastLog) > 30*time.Second {
					log.Warn("membership read from redis failed; keeping the last table", "err", err, "failures", w.Failures.Load(), "members", t.Len())
					lastLog = time.Now()
				}
			}
		}
	}()
	return w, err
}

func (w *RedisWatcher) read(ctx context.Context, client redis.UniversalClient, cluster uint16, t *Table, log *slog.Logger) error {
	w.Polls.Add(1)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	members, addrs := RedisKeys(cluster)
	tnow, err := client.Time(ctx).Result()
	if err != nil {
		w.Failures.Add(1)
		return fmt.Errorf("membership: redis: %w", err)
	}
	now := strconv.FormatInt(tnow.UnixMilli(), 10)
	ids, err := client.ZRangeByScore(ctx, members, &redis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		w.Failures.Add(1)
		return fmt.Errorf("membership: redis: %w", err)
	}
	entries := make(map[uint32]netip.AddrPort, len(ids))
	if len(ids) > 0 {
		vals, err := client.HMGet(ctx, addrs, ids...).Result()
		if err != nil {
			w.Failures.Add(1)
			return fmt.Errorf("membership: redis: %w", err)
		}
		for i, v := range vals {
			s, _ := v.(string)
			id, ierr := strconv.ParseUint(ids[i], 10, 32)
			ap, aerr := netip.ParseAddrPort(s)
			if ierr != nil || aerr != nil || id == 0 {
				w.Failures.Add(1)
				log.Warn("membership: skipping a bad redis entry", "id", ids[i], "addr", s)
				continue
			}
			entries[uint32(id)] = ap
		}
	}
	// One read that finds nobody (a Redis failover to an empty replica, a
	// flushed database) must not empty a live table, which would drop
	// every flow: a table is emptied only by two such reads in a row.
	if len(entries) == 0 && t.Len() > 0 && !w.emptyOnce.Swap(true) {
		return nil
	}
	if len(entries) > 0 {
		w.emptyOnce.Store(false)
	}
	return t.Set(entries)
}

// Close stops the background reads and waits for them.
func (w *RedisWatcher) Close() error {
	w.once.Do(func() {
		w.cancel()
		w.wg.Wait()
	})
	return nil
}
