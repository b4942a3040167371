package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The bounds every Switchboard HTTP server applies (NewServer), so that a
// client that never finishes what it started holds a connection, a
// goroutine and its buffers for a bounded time (docs/security.md, "HTTP
// servers").
const (
	// ReadHeaderTimeout bounds the wait for a request's header: from the
	// connection's accept for its first request, from the request's first
	// byte for the later ones.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds reading a whole request, header and body, from
	// the same moment: a body that trickles in is cut there. The largest
	// body a server takes (an offer) is 64 KiB.
	ReadTimeout = 10 * time.Second
	// WriteTimeout bounds a request's handling and the writing of its
	// response, from the moment its handler starts: a client that does
	// not read its response is cut there. Set per request, so that a
	// profile (HandlePprof) may run longer.
	WriteTimeout = 30 * time.Second
	// IdleTimeout bounds how long a keep-alive connection may wait for its
	// next request. A server at its cap of connections closes its oldest
	// idle one sooner, to take a new one (Limits.MaxConns).
	IdleTimeout = 15 * time.Second
	// MaxHeaderBytes caps a request's header (the request line, the header
	// fields and their keys): the largest real request carries a bearer
	// token and a few proxy headers, a few KiB. Past it the server answers
	// 431 and closes the connection. net/http reads up to 4 KiB beyond
	// it before it stops.
	MaxHeaderBytes = 16 << 10
)

// Connection caps (Limits).
const (
	// DefaultMaxConns is Limits.MaxConns's default.
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerSource is the per-source cap of the signaling
	// servers: as many connections as sessions a client may have pending
	// (transceiver.DefaultMaxPendingPerClient).
	DefaultMaxConnsPerSource = 64
)

// Limits are a Server's connection caps.
type Limits struct {
	// Name labels the server's metrics (server="…") and log lines.
	Name string
	// MaxConns caps the connections open at once. A new connection
	// beyond it takes the place of the connection idle the longest
	// (closed); with none idle, it waits until one closes: the first
	// accepted but not yet read (one descriptor), the others in the
	// kernel's accept queue. 0 means DefaultMaxConns; below 0, none but the
	// descriptor bound: whatever its value, the cap is at most half the
	// process's descriptor limit (RLIMIT_NOFILE) when the Server is made,
	// so that one server's connections cannot take the descriptors the
	// rest of the process needs (sessions, backend connections).
	MaxConns int
	// PerSource caps the connections open at once from one source: an
	// IPv4 address, or an IPv6 /64. A connection beyond it is closed at
	// once (counted). 0: no cap.
	PerSource int
	// Exempt lists sources with no per-source cap: the proxies in front
	// (a director, a load balancer, a sidecar on loopback), which carry
	// many clients.
	Exempt []netip.Prefix
}

// Loopback returns the loopback prefixes, 127.0.0.0/8 and ::1/128: a
// Limits.Exempt for a server whose loopback clients are proxies or the
// operator's own tools.
func Loopback() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// Server is an HTTP server within the bounds above (ReadHeaderTimeout,
// ReadTimeout, WriteTimeout, IdleTimeout, MaxHeaderBytes) and its
// Limits. A connection it hands to a handler that hijacks it (a
// WebSocket) has its deadlines cleared by net/http: it is the handler's to
// bound, and it counts against MaxConns until closed.
//
// It keeps its accept loop from spinning when the process is out of
// descriptors (EMFILE, ENFILE) or the kernel out of memory (ENOBUFS,
// ENOMEM): it waits, 5 ms at first, doubling up to 1 s while the error
// lasts. Its warnings (a cap reached, a connection refused, an accept
// failed) are logged at most every 10 s each, with a count.
//
// Its counters are exported through the Registerer given to NewServer,
// labelled server="<Limits.Name>":
//
//	switchboard_http_connections                 connections open
//	switchboard_http_connections_refused_total   connections closed at once: their source had PerSource open
//	switchboard_http_idle_closed_total           idle keep-alive connections closed to take a new one at MaxConns
//	switchboard_http_accept_waits_total          accepts that waited at MaxConns, no connection being idle
//	switchboard_http_accept_errors_total         accepts failed for want of descriptors or memory (retried)
type Server struct {
	// Set once.
	srv       *http.Server
	ln        net.Listener
	max       int
	perSource int
	exempt    []netip.Prefix
	log       *slog.Logger
	slots     chan struct{} // one per open connection, up to max
	idleCh    chan struct{} // a connection became idle (capacity 1)
	done      chan struct{} // closed when the listener closes
	closeOnce sync.Once

	mu       sync.Mutex
	bySource map[netip.Addr]int // guarded by mu: connections open per capped source
	idle     map[*conn]struct{} // guarded by mu: connections between requests

	open, refused, idleClosed, waits, acceptErrs atomic.Int64
	logRefused, logWaits, logErrs                rateLog
}

// NewServer returns a server of h on ln within lim. reg, if not nil, gets
// its metrics; log (nil: slog.Default) its warnings and net/http's error
// log (at Warn). It fails only when reg refuses the metrics.
func NewServer(ln net.Listener, h http.Handler, lim Limits, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	maxConns := lim.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	if fdCap := descriptorCap(); fdCap > 0 && (maxConns < 0 || maxConns > fdCap) {
		maxConns = fdCap
	}
	if maxConns < 0 { // no descriptor limit known
		maxConns = 1 << 20
	}
	s := &Server{
		max:       maxConns,
		perSource: lim.PerSource,
		exempt:    lim.Exempt,
		log:       log.With("server", lim.Name, "addr", ln.Addr().String()),
		slots:     make(chan struct{}, maxConns),
		idleCh:    make(chan struct{}, 1),
		done:      make(chan struct{}),
		bySource:  map[netip.Addr]int{},
		idle:      map[*conn]struct{}{},
	}
	s.ln = &listener{Listener: ln, s: s}
	s.srv = &http.Server{
		Handler:           withWriteDeadline(h),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         s.connState,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if reg != nil {
		labels := prometheus.Labels{"server": lim.Name}
		gauge := func(name, help string, v *atomic.Int64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return float64(v.Load()) })
		}
		counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return float64(v.Load()) })
		}
		for _, c := range []prometheus.Collector{
			gauge("switchboard_http_connections", "HTTP connections open (docs/security.md, HTTP servers).", &s.open),
			counter("switchboard_http_connections_refused_total", "HTTP connections closed at once because their source had its cap of connections open.", &s.refused),
			counter("switchboard_http_idle_closed_total", "Idle keep-alive HTTP connections closed to take a new connection at the server's cap.", &s.idleClosed),
			counter("switchboard_http_accept_waits_total", "HTTP accepts that waited because the server had its cap of connections open, none idle.", &s.waits),
			counter("switchboard_http_accept_errors_total", "HTTP accepts that failed for want of file descriptors or kernel memory, retried after a pause.", &s.acceptErrs),
		} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// descriptorCap returns half the process's descriptor limit, or 0 if it
// is unknown or too large to matter.
func descriptorCap() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur / 2)
}

// withWriteDeadline gives each request WriteTimeout to be handled and
// answered.
func withWriteDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(WriteTimeout))
		h.ServeHTTP(w, r)
	})
}

// HandlePprof mounts Go's profiles (net/http/pprof) at /debug/pprof/ on
// mux. A profile or trace asked for N seconds (?seconds=N; the defaults
// are 30 and 1) may take N seconds plus WriteTimeout.
func HandlePprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", profileDeadline(30, pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", profileDeadline(1, pprof.Trace))
}

// profileDeadline moves the write deadline of a request for a profile of
// ?seconds= (default def) to that long plus WriteTimeout.
func profileDeadline(def int, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sec, err := strconv.Atoi(r.FormValue("seconds"))
		if err != nil || sec <= 0 {
			sec = def
		}
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Duration(sec)*time.Second + WriteTimeout))
		h(w, r)
	}
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// MaxConns returns the cap on open connections in force (Limits.MaxConns).
func (s *Server) MaxConns() int { return s.max }

// Stats are a Server's counters (the metrics of Server's doc).
type Stats struct {
	Open, Refused, IdleClosed, AcceptWaits, AcceptErrors int64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{Open: s.open.Load(), Refused: s.refused.Load(), IdleClosed: s.idleClosed.Load(),
		AcceptWaits: s.waits.Load(), AcceptErrors: s.acceptErrs.Load()}
}

// Serve serves until Shutdown or Close, or the listener fails
// (http.Server.Serve). It closes the listener.
func (s *Server) Serve() error { return s.srv.Serve(s.ln) }

// Shutdown stops the server gracefully (http.Server.Shutdown): it closes
// the listener and the idle connections, and waits for the active ones
// until ctx ends. Hijacked connections are left to their handlers.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Run serves until ctx ends, then shuts down, giving requests in flight
// up to 5 s. It returns Serve's error, or Shutdown's.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listener applies the server's caps at Accept.
type listener struct {
	net.Listener
	s *Server
}

// Accept waits for a connection within the caps (Limits). At MaxConns it
// holds the connection it accepted (one descriptor) until it has a slot
// for it.
func (l *listener) Accept() (net.Conn, error) {
	s := l.s
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !outOfResources(err) {
				return nil, err
			}
			s.acceptErrs.Add(1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logErrs.warn(s.log, "http accept failed; retrying after a pause", "err", err.Error(), "pause", backoff.String())
			select {
			case <-time.After(backoff):
				continue
			case <-s.done:
				return nil, net.ErrClosed
			}
		}
		backoff = 0
		src := source(c.RemoteAddr())
		capped := s.perSource > 0 && src.IsValid() && !s.exempted(src)
		if capped {
			s.mu.Lock()
			n := s.bySource[src]
			if n >= s.perSource {
				s.mu.Unlock()
				_ = c.Close()
				s.refused.Add(1)
				s.logRefused.warn(s.log, "http connection refused: its source has its cap of connections open", "source", src.String(), "per_source", s.perSource)
				continue
			}
			s.bySource[src] = n + 1
			s.mu.Unlock()
		}
		cc := &conn{Conn: c, s: s, src: src, capped: capped}
		if err := s.slot(); err != nil {
			s.unsource(cc)
			_ = c.Close()
			return nil, err
		}
		s.open.Add(1)
		return cc, nil
	}
}

// Close closes the listener; an Accept waiting returns net.ErrClosed.
// Connections already accepted stay open.
func (l *listener) Close() error {
	l.s.closeOnce.Do(func() { close(l.s.done) })
	return l.Listener.Close()
}

// slot takes a connection slot: a free one, or the one of the connection
// idle the longest, closed; with none idle, it waits for either.
func (s *Server) slot() error {
	for {
		select {
		case s.slots <- struct{}{}:
			return nil
		default:
		}
		if s.closeIdlest() {
			continue
		}
		s.waits.Add(1)
		s.logWaits.warn(s.log, "http connections at the server's cap, none idle: new ones wait until one closes", "max_conns", s.max)
		select {
		case s.slots <- struct{}{}:
			return nil
		case <-s.idleCh:
		case <-s.done:
			return net.ErrClosed
		}
	}
}

// closeIdlest closes the connection idle the longest, if any, which
// gives back its slot.
func (s *Server) closeIdlest() bool {
	s.mu.Lock()
	var oldest *conn
	for c := range s.idle {
		if oldest == nil || c.idleSince.Before(oldest.idleSince) {
			oldest = c
		}
	}
	if oldest != nil {
		delete(s.idle, oldest)
	}
	s.mu.Unlock()
	if oldest == nil {
		return false
	}
	s.idleClosed.Add(1)
	_ = oldest.Close()
	return true
}

// connState tracks which connections are idle (http.Server.ConnState).
func (s *Server) connState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	s.mu.Lock()
	if st == http.StateIdle {
		c.idleSince = time.Now()
		s.idle[c] = struct{}{}
	} else {
		delete(s.idle, c)
	}
	s.mu.Unlock()
	if st == http.StateIdle {
		select {
		case s.idleCh <- struct{}{}:
		default:
		}
	}
}

func (s *Server) exempted(a netip.Addr) bool {
	for _, p := range s.exempt {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// release gives back a closed connection's slots.
func (s *Server) release(c *conn) {
	s.unsource(c)
	s.open.Add(-1)
	<-s.slots
}

// unsource forgets c: no longer idle, no longer counted for its source.
func (s *Server) unsource(c *conn) {
	s.mu.Lock()
	delete(s.idle, c)
	if c.capped {
		if n := s.bySource[c.src] - 1; n > 0 {
			s.bySource[c.src] = n
		} else {
			delete(s.bySource, c.src)
		}
	}
	s.mu.Unlock()
}

// source returns the per-source key of addr: the IPv4 address, or the
// IPv6 address's /64.
func source(addr net.Addr) netip.Addr {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	a := ta.AddrPort().Addr().Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// outOfResources reports whether an Accept error is the process or the
// kernel out of descriptors or memory.
func outOfResources(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// conn is an accepted connection; Close gives back its slots once.
type conn struct {
	net.Conn
	s         *Server
	src       netip.Addr
	capped    bool
	idleSince time.Time // guarded by s.mu
	once      sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.release(c) })
	return err
}

// CloseWrite half-closes the TCP connection: net/http does so before it
// closes a connection whose request it did not read to the end (a 413, a
// 431), so that its response is not lost to a reset.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// rateLog logs a warning at most once per rateLogEvery, with the number of
// occurrences since the last line (count).
type rateLog struct {
	last  atomic.Int64 // unix nanoseconds of the last line
	count atomic.Int64 // occurrences not yet logged
}

const rateLogEvery = 10 * time.Second

func (r *rateLog) warn(log *slog.Logger, msg string, args ...any) {
	r.count.Add(1)
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(rateLogEvery) || !r.last.CompareAndSwap(last, now) {
		return
	}
	log.Warn(msg, append(args, "count", r.count.Swap(0))...)
}
