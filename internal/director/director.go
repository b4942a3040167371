// Package director is Switchboard's signaling front door. It decides, per
// offer, which region the client is in and so which cluster the session
// lives in, then hands the offer to a transceiver of that cluster, telling
// it the region so that its answer advertises the region's nearest ingress
// (docs/design.md §2.3).
//
// The region comes, in order, from:
//
//  1. a region header set by the CDN or load balancer in front
//     (Config.RegionHeader), when its value names a configured region;
//  2. the client IP, matched against each region's prefixes, longest
//     prefix first;
//  3. Config.DefaultRegion, the documented fallback.
//
// The offer is forwarded either by proxying (the default: no extra round
// trip for the client) or by a 307 redirect to the transceiver, which RFC
// 9725 §4.5 allows. When proxying, the session's Location is rewritten to
// `/v1/calls/{upstream}~{id}` so later DELETE and PATCH requests reach the
// same transceiver through the director.
package director

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/httpapi"
	"github.com/switchboard-rtc/switchboard/internal/trusted"
)

// RegionHeader is the header the director sets on requests to
// transceivers (transceiver.RegionHeader): the region it chose.
const RegionHeader = "X-Switchboard-Region"

// Config configures a director. Validate fills defaults.
type Config struct {
	// RegionHeader is the request header a trusted CDN sets to the
	// client's region (e.g. "CloudFront-Viewer-Region" mapped to region
	// names). Empty ignores region headers from clients, who could forge it.
	RegionHeader string `yaml:"region_header"`
	// Regions maps a region name to its cluster and the client prefixes
	// that belong to it.
	Regions map[string]Region `yaml:"regions"`
	// DefaultRegion is used when neither the header nor the client IP
	// decides. Required; must be one of Regions.
	DefaultRegion string `yaml:"default_region"`
	// Clusters maps a cluster name to the signaling base URLs of its
	// transceivers (e.g. "http://10.1.0.10:8080"), picked round-robin.
	Clusters map[string][]string `yaml:"clusters"`
	// Mode is "proxy" (default) or "redirect" (307 to the transceiver).
	Mode string `yaml:"mode"`
	// TrustedProxies are prefixes whose X-Forwarded-For is believed: the
	// client IP is then its last entry. Empty trusts none.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Auth, when set, makes the director serve POST /v1/client_tokens
	// (internal/auth) with the same keys as the transceivers and refuse
	// offers without a valid token (401) before routing them; it passes
	// Authorization through, and the transceivers check it again.
	Auth auth.Config `yaml:"auth"`
}

// Region is one region's entry in Config.Regions.
type Region struct {
	// Cluster names the entry of Config.Clusters that serves this region.
	Cluster string `yaml:"cluster"`
	// Prefixes are client IP prefixes (CIDR) that belong to the region.
	Prefixes []string `yaml:"prefixes"`
}

type prefixRoute struct {
	prefix netip.Prefix
	region string
}

type upstream struct {
	name  string // "<cluster>-<index>", used in rewritten Locations
	base  *url.URL
	proxy *httputil.ReverseProxy
}

// Director routes offers. It is safe for concurrent use.
type Director struct {
	// Set once.
	cfg       Config
	log       *slog.Logger
	prefixes  []prefixRoute // longest first
	trusted   trusted.Prefixes
	clusters  map[string][]*upstream
	upstreams map[string]*upstream
	next      atomic.Uint64 // round-robin cursor
	auth      *auth.Authority
}

// Defaults of `switchboard director`.
const (
	// DefaultListenAddr serves the signaling API, /metrics, /live and
	// /ready, ip:port.
	DefaultListenAddr = "127.0.0.1:8443"
	// DefaultMode is Config.Mode's default: forward the offer.
	DefaultMode = "proxy"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("director: invalid config")

// New validates cfg and returns a director.
func New(cfg Config, log *slog.Logger) (*Director, error) {
	if log == nil {
		log = slog.Default()
	}
	d := &Director{cfg: cfg, log: log, clusters: map[string][]*upstream{}, upstreams: map[string]*upstream{}}
	var err error
	if d.auth, err = auth.New(cfg.Auth); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch cfg.Mode {
	case "":
		d.cfg.Mode = DefaultMode
	case "proxy", "redirect":
	default:
		return nil, fmt.Errorf("%w: mode %q must be proxy or redirect", ErrConfig, cfg.Mode)
	}
	if len(cfg.Clusters) == 0 {
		return nil, fmt.Errorf("%w: clusters is empty; list each cluster's transceiver signaling URLs", ErrConfig)
	}
	for name, urls := range cfg.Clusters {
		if len(urls) == 0 {
			return nil, fmt.Errorf("%w: cluster %q has no transceiver URLs", ErrConfig, name)
		}
		for i, raw := range urls {
			u, err := url.Parse(raw)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("%w: cluster %q: %q must be an http(s) base URL such as http://10.0.0.5:8080", ErrConfig, name, raw)
			}
			up := &upstream{name: fmt.Sprintf("%s-%d", name, i), base: u}
			up.proxy = &httputil.ReverseProxy{
				Rewrite: func(pr *httputil.ProxyRequest) {
					pr.SetURL(u)
					pr.Out.Host = u.Host
					// The client as the director saw it (clientIP), for a
					// transceiver's per-client bounds (its trusted_proxies).
					if ip := d.clientIP(pr.In); ip.IsValid() {
						pr.Out.Header.Set("X-Forwarded-For", ip.String())
					}
				},
				ModifyResponse: d.rewriteLocation(up),
				ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
					d.log.Warn("transceiver unreachable", "upstream", up.name, "err", err)
					httpapi.WriteError(w, http.StatusBadGateway, "transceiver_unavailable", "the chosen transceiver did not answer")
				},
			}
			d.clusters[name] = append(d.clusters[name], up)
			d.upstreams[up.name] = up
		}
	}
	if len(cfg.Regions) == 0 {
		return nil, fmt.Errorf("%w: regions is empty; name at least one region and its cluster", ErrConfig)
	}
	for name, r := range cfg.Regions {
		if _, ok := cfg.Clusters[r.Cluster]; !ok {
			return nil, fmt.Errorf("%w: region %q names cluster %q, which is not in clusters", ErrConfig, name, r.Cluster)
		}
		for _, p := range r.Prefixes {
			pfx, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, fmt.Errorf("%w: region %q: prefix %q is not a CIDR such as 198.51.100.0/24", ErrConfig, name, p)
			}
			d.prefixes = append(d.prefixes, prefixRoute{pfx.Masked(), name})
		}
	}
	slices.SortStableFunc(d.prefixes, func(a, b prefixRoute) int { return cmp.Compare(b.prefix.Bits(), a.prefix.Bits()) })
	if _, ok := cfg.Regions[cfg.DefaultRegion]; !ok {
		return nil, fmt.Errorf("%w: default_region %q must be one of the regions", ErrConfig, cfg.DefaultRegion)
	}
	if d.trusted, err = trusted.Parse(cfg.TrustedProxies); err != nil {
		return nil, fmt.Errorf("%w: trusted_proxies %w", ErrConfig, err)
	}
	return d, nil
}

// clientIP returns the client's address: the peer, or the last
// X-Forwarded-For entry when the peer is a trusted proxy.
func (d *Director) clientIP(r *http.Request) netip.Addr {
	return trusted.ClientAddr(r, d.trusted)
}

// Region returns the region chosen for r and how it was chosen: "header",
// "prefix" or "default".
func (d *Director) Region(r *http.Request) (region, source string) {
	if d.cfg.RegionHeader != "" {
		if v := strings.TrimSpace(r.Header.Get(d.cfg.RegionHeader)); v != "" {
			if _, ok := d.cfg.Regions[v]; ok {
				return v, "header"
			}
		}
	}
	if ip := d.clientIP(r); ip.IsValid() {
		for _, p := range d.prefixes {
			if p.prefix.Contains(ip) {
				return p.region, "prefix"
			}
		}
	}
	return d.cfg.DefaultRegion, "default"
}

// Handler serves the same signaling API as a transceiver:
//
//	POST   /v1/calls, /v1/realtime/calls   route the offer
//	DELETE /v1/calls/{ref}                 proxied to the owning transceiver
//	PATCH  /v1/calls/{ref}                 proxied to the owning transceiver
//	POST   /v1/client_tokens               API key → client token (Config.Auth)
//	GET    /live, /ready                   probes
//
// The Locations it hands out are /v1/calls/{ref}; /v1/realtime/calls/{ref}
// is served the same (httpapi.Signaling).
func (d *Director) Handler() http.Handler {
	return httpapi.Signaling{Offer: d.handleOffer, Patch: d.handleSession, Delete: d.handleSession,
		Mint: d.auth.MintHandler()}.Handler()
}

func (d *Director) handleOffer(w http.ResponseWriter, r *http.Request) {
	// With auth on, an offer without a valid token stops here instead of
	// costing a transceiver a request (which checks it again, and binds the
	// session to it).
	if _, err := d.auth.Verify(r, time.Now()); err != nil {
		auth.Unauthorized(w, err)
		return
	}
	region, source := d.Region(r)
	cluster := d.cfg.Regions[region].Cluster
	ups := d.clusters[cluster]
	up := ups[d.next.Add(1)%uint64(len(ups))]
	d.log.Debug("offer routed", "region", region, "source", source, "cluster", cluster, "upstream", up.name)
	if d.cfg.Mode == "redirect" {
		target := up.base.JoinPath(r.URL.Path)
		q := target.Query()
		q.Set("region", region)
		target.RawQuery = q.Encode()
		w.Header().Set("Location", target.String())
		w.WriteHeader(http.StatusTemporaryRedirect)
		return
	}
	r.Header.Set(RegionHeader, region)
	d.proxyOffer(w, r, ups, up)
}

// maxOfferBytes bounds the offers the director buffers (as transceivers do).
const maxOfferBytes = 64 << 10

// proxyOffer forwards the offer to first, and on a 502 (unreachable) or 503
// (draining or full) to the cluster's other transceivers in turn, so that a
// rolling restart or a dead pod costs a retry, not a failed call. The offer
// and the answer are small, so both are buffered.
func (d *Director) proxyOffer(w http.ResponseWriter, r *http.Request, ups []*upstream, first *upstream) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOfferBytes))
	if err != nil {
		httpapi.WriteError(w, http.StatusRequestEntityTooLarge, "offer_too_large", "the offer is larger than 64 KiB")
		return
	}
	start := slices.Index(ups, first)
	for i := range ups {
		up := ups[(start+i)%len(ups)]
		req := r.Clone(r.Context())
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		rec := &recorder{header: http.Header{}}
		up.proxy.ServeHTTP(rec, req)
		if (rec.code == http.StatusBadGateway || rec.code == http.StatusServiceUnavailable) && i < len(ups)-1 {
			d.log.Info("transceiver refused the offer; trying the next", "upstream", up.name, "status", rec.code)
			continue
		}
		rec.writeTo(w)
		return
	}
}

// recorder is an in-memory http.ResponseWriter for one proxied offer.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if r.code == 0 {
		r.code = http.StatusOK
	}
	w.WriteHeader(r.code)
	_, _ = w.Write(r.body.Bytes())
}

// rewriteLocation turns a transceiver's "/v1/calls/{id}" into the
// director's "/v1/calls/{upstream}~{id}".
func (d *Director) rewriteLocation(up *upstream) func(*http.Response) error {
	return func(resp *http.Response) error {
		// CORS is the director's; drop the transceiver's so headers are not doubled.
		for k := range resp.Header {
			if strings.HasPrefix(k, "Access-Control-") {
				resp.Header.Del(k)
			}
		}
		loc := resp.Header.Get("Location")
		if id, ok := strings.CutPrefix(loc, httpapi.CallsPath+"/"); ok && id != "" && !strings.Contains(id, "/") {
			resp.Header.Set("Location", httpapi.CallsPath+"/"+up.name+"~"+id)
		}
		return nil
	}
}

// validSessionID reports whether id can be a transceiver's session id
// (URL-safe base64), so that nothing else is spliced into an upstream path.
func validSessionID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (d *Director) handleSession(w http.ResponseWriter, r *http.Request) {
	name, id, ok := strings.Cut(r.PathValue("id"), "~")
	up := d.upstreams[name]
	if !ok || up == nil || !validSessionID(id) {
		httpapi.WriteError(w, http.StatusNotFound, "not_found", "no such session")
		return
	}
	r.URL.Path = httpapi.CallsPath + "/" + id
	r.URL.RawPath = ""
	up.proxy.ServeHTTP(w, r)
}
