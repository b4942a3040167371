// Package flowstore is the store of the relay's flow cache, in Redis
// (docs/design.md §2.2: "a Redis cache of <client ip:port → transceiver
// ip:port> lets a relay recover a flow before that next STUN arrives";
// docs/relay.md, "Flow cache").
//
// It is a thin byte store: the relay (internal/relay, its flowcache*.go files)
// encodes and decodes the values and decides what to write and when; this
// package only names the keys and batches the round trips. A Redis
// satisfies relay.FlowStore, so internal/relay never imports go-redis and
// its tests can run against a real Redis through this package.
//
// Keys, one per client address, in the style of the membership registry's
// (internal/membership): the cluster id in braces, a Redis Cluster hash
// tag, so that all of one cluster's keys live on one node, and MGET and
// the pipeline of SETs stay on one connection:
//
//	switchboard:{<cluster>}:flow:<client ip:port>
//
// e.g. "switchboard:{3}:flow:198.51.100.1:50000" or
// "switchboard:{3}:flow:[2001:db8::2]:50001" (netip.AddrPort.String of the
// canonical, unmapped address). Put writes a batch with one pipeline of
// SET key value PX ttl; Get reads a batch with one MGET. Nothing here runs
// per packet.
package flowstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// KeyPrefix returns the start of cluster's keys; the client address follows.
func KeyPrefix(cluster uint16) string {
	return "switchboard:{" + strconv.Itoa(int(cluster)) + "}:flow:"
}

// Timeouts of the Redis client: the relay bounds every call with a context
// (a Get 500 ms, a Put 1 s), so these only cap what a context does not
// (dials), and are no shorter than those.
const (
	dialTimeout = 250 * time.Millisecond
	ioTimeout   = time.Second
	poolSize    = 4
)

// ErrBadBatch is returned when the argument slices of Put or Get differ in length.
var ErrBadBatch = errors.New("flowstore: clients and values differ in length")

// Redis is a flow cache in one Redis server (or anything speaking its
// protocol). It is safe for concurrent use.
type Redis struct {
	// Set once by New, never mutated.
	client *redis.Client
	prefix string // KeyPrefix(cluster)
	owned  bool   // Close closes client
}

// New returns a cache in the Redis at addr for cluster's keys. addr is
// either host:port (no password, no TLS), or a URL:
//
//	redis://[[user]:password@]host[:port][/db]    (port 6379 by default)
//	rediss://[[user]:password@]host[:port][/db]   (TLS, verified against host)
//
// (redis.ParseURL; its query parameters, such as dial_timeout, are
// overridden by this package's timeouts, pool and retries, which the relay
// relies on). New does not connect: the first Put or Get does, and a Redis
// that is down or refuses the password shows as errors from them (the
// relay counts, logs and backs off). Errors never contain the password.
func New(addr string, cluster uint16) (*Redis, error) {
	opt, err := options(addr)
	if err != nil {
		return nil, err
	}
	opt.DialTimeout = dialTimeout
	opt.ReadTimeout = ioTimeout
	opt.WriteTimeout = ioTimeout
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1   // the relay retries on its own schedule
	opt.DialerRetries = 1 // idem: one dial per call, failing fast
	opt.PoolSize = poolSize
	opt.MinIdleConns, opt.MaxIdleConns = 0, 0
	opt.DisableIdentity = true // no CLIENT SETINFO round trip per dial
	r := NewWithClient(redis.NewClient(opt), cluster)
	r.owned = true
	return r, nil
}

// options parses New's addr. Its errors never repeat a password: an addr
// with an '@' (where a password would be) is shown only once it parses as
// a URL whose userinfo holds every '@', and then redacted.
func options(addr string) (*redis.Options, error) {
	const want = "want host:port, redis://[[user]:password@]host[:port][/db], or rediss://… for TLS"
	const unparsed = "flowstore: Redis address has an '@' but does not parse as a redis:// or rediss:// URL (not shown: it may hold a password); percent-encode / # ? @ %% in the password; %s"
	hasAt := strings.Contains(addr, "@")
	switch {
	case addr == "":
		return nil, errors.New("flowstore: empty Redis address; " + want)
	case !strings.Contains(addr, "://"):
		if hasAt {
			return nil, fmt.Errorf(unparsed, want)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("flowstore: Redis address %q is not host:port; %s", addr, want)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("flowstore: Redis address %q: port %q is not a number from 1 to 65535; %s", addr, port, want)
		}
		return &redis.Options{Addr: addr}, nil
	}
	u, err := url.Parse(addr)
	if hasAt && (err != nil || u.User == nil || strings.Contains(u.Opaque+u.Host+u.Path+u.RawPath+u.RawQuery+u.Fragment, "@")) {
		// The password did not end up (whole) in the userinfo, or the
		// parser's reason may quote a piece of it ("invalid port
		// \":pw\"", "invalid URL escape \"%zz\""): say nothing of addr.
		return nil, fmt.Errorf(unparsed, want)
	}
	if err != nil {
		// No '@', so no password. url.Error repeats the URL; its reason suffices.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("flowstore: Redis URL does not parse (%v); %s", err, want)
	}
	// The whole userinfo is hidden: a password given as the user name
	// ("redis://pw@host") is no less a secret.
	shown := addr
	if u.User != nil {
		c := *u
		c.User = url.User("xxxxx")
		shown = c.String()
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("flowstore: Redis URL %q: scheme %q; %s", shown, u.Scheme, want)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("flowstore: Redis URL %q has no host; %s", shown, want)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("flowstore: Redis URL %q: port %q is not a number from 1 to 65535; %s", shown, p, want)
		}
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("flowstore: Redis URL %q: %v; %s", shown, err, want)
	}
	return opt, nil
}

// NewWithClient is New over an existing client, which Close leaves open.
func NewWithClient(c *redis.Client, cluster uint16) *Redis {
	return &Redis{client: c, prefix: KeyPrefix(cluster)}
}

// Key returns the Redis key of client's flow.
func (r *Redis) Key(client netip.AddrPort) string {
	return r.prefix + netip.AddrPortFrom(client.Addr().Unmap(), client.Port()).String()
}

// Put stores values[i] under clients[i]'s key, each expiring after ttl,
// in one pipelined round trip. An error means some may not be written.
func (r *Redis) Put(ctx context.Context, clients []netip.AddrPort, values [][]byte, ttl time.Duration) error {
	if len(clients) != len(values) {
		return ErrBadBatch
	}
	if len(clients) == 0 {
		return nil
	}
	pipe := r.client.Pipeline()
	for i, c := range clients {
		pipe.Set(ctx, r.Key(c), values[i], ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("flowstore: put %d: %w", len(clients), err)
	}
	return nil
}

// Get reads clients' values with one MGET into values, which must have
// the same length: values[i] is nil when clients[i] has no entry.
func (r *Redis) Get(ctx context.Context, clients []netip.AddrPort, values [][]byte) error {
	if len(clients) != len(values) {
		return ErrBadBatch
	}
	if len(clients) == 0 {
		return nil
	}
	keys := make([]string, len(clients))
	for i, c := range clients {
		keys[i] = r.Key(c)
	}
	res, err := r.client.MGet(ctx, keys...).Result()
	if err != nil {
		return fmt.Errorf("flowstore: get %d: %w", len(clients), err)
	}
	if len(res) != len(clients) {
		return fmt.Errorf("flowstore: get %d: %d replies", len(clients), len(res))
	}
	for i, v := range res {
		values[i] = nil
		if s, ok := v.(string); ok {
			values[i] = []byte(s)
		}
	}
	return nil
}

// LogRedisTo sends go-redis's own log lines (one per failed dial, among
// others) to log at Debug level. It is process-wide (go-redis has one
// logger): the relay command calls it so that a Redis that is down shows
// as the relay's one warning per interval, not a line per dial.
func LogRedisTo(log *slog.Logger) {
	redis.SetLogger(slogLogger{log})
}

type slogLogger struct{ log *slog.Logger }

func (l slogLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
	}
}

// Close closes the Redis client if New made it. It is idempotent.
func (r *Redis) Close() error {
	if !r.owned {
		return nil
	}
	err := r.client.Close()
	if errors.Is(err, redis.ErrClosed) {
		return nil
	}
	return err
}
