package membership

// The Kubernetes membership source.
//
// Transceivers run as a StatefulSet behind a headless Service whose one UDP
// port (named "hop" in the chart) is the internal hop. The EndpointSlice
// controller publishes one endpoint per pod with its IP, its hostname (the
// pod name, e.g. "switchboard-transceiver-3") and its conditions. The
// source watches those EndpointSlices through a client-go informer and, on
// every change, rebuilds the whole membership and hands it to Table.Set:
//
//	id   = ordinal in the hostname ("…-3" → 3) + IDOffset
//	addr = endpoint IP : port named PortName in the slice
//
// The chart starts the StatefulSet's ordinals at the first transceiver id
// (spec.ordinals.start) and gives each pod its ordinal as -id through the
// apps.kubernetes.io/pod-index label, so IDOffset is 0 there and the pod
// name carries the id.
//
// Which endpoints count: ready ones, and terminating ones. A terminating
// transceiver is draining: it takes no new offers (the signaling Service
// stops sending them, because it is not ready) but its live sessions still
// need their media forwarded until it exits, so relays keep it until the
// EndpointSlice controller removes it with its pod. Endpoints that are not
// ready and not terminating (starting, or failing their readiness probe)
// are left out. The source never resolves names and never takes an address
// from anywhere but the watched EndpointSlices of one Service in one
// namespace, so docs/design.md §3 holds: a relay sends only to those pods.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// DefaultKubePortName is the name of the internal-hop port on the
// transceivers' headless Service (deploy/switchboard/templates).
const DefaultKubePortName = "hop"

// ErrKubeConfig is wrapped by every KubeConfig error.
var ErrKubeConfig = errors.New("membership: invalid Kubernetes source config")

// KubeConfig configures a Kubernetes membership source.
type KubeConfig struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// Namespace of the Service. Required.
	Namespace string
	// Service is the name of the transceivers' headless Service; its
	// EndpointSlices carry the label kubernetes.io/service-name=Service.
	// Required.
	Service string
	// PortName is the name of the internal-hop port in the EndpointSlices.
	// Default DefaultKubePortName. A slice without that port contributes
	// nothing.
	PortName string
	// IDOffset is added to the hostname ordinal to give the transceiver id.
	IDOffset uint32
	// Resync is the informer's resync period; 0 disables resync (changes
	// still arrive as watch events).
	Resync time.Duration
	// Logger receives membership changes and skipped endpoints. Default:
	// discard.
	Logger *slog.Logger
}

// Validate checks the config and fills defaults.
func (c *KubeConfig) Validate() error {
	switch {
	case c.Client == nil:
		return fmt.Errorf("%w: no Kubernetes client", ErrKubeConfig)
	case c.Namespace == "":
		return fmt.Errorf("%w: namespace is empty: name the namespace of the transceivers' headless Service", ErrKubeConfig)
	case c.Service == "":
		return fmt.Errorf("%w: service is empty: name the transceivers' headless Service", ErrKubeConfig)
	}
	if c.PortName == "" {
		c.PortName = DefaultKubePortName
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Kube keeps a Table equal to the ready (or draining) endpoints of a
// Kubernetes Service. Create it with WatchKube; stop it with Close.
type Kube struct {
	// Set once, never mutated.
	cfg     KubeConfig
	table   *Table
	factory informers.SharedInformerFactory
	lister  discoverylisters.EndpointSliceLister
	synced  cache.InformerSynced
	cancel  context.CancelFunc
	kick    chan struct{} // capacity 1: coalesces informer events into one rebuild
	wg      sync.WaitGroup
	once    sync.Once
	started chan struct{} // closed after the first rebuild following the initial sync

	// Owned by the rebuild goroutine.
	last map[uint32]netip.AddrPort
}

// WatchKube starts watching the Service's EndpointSlices and keeps t equal
// to their membership, in the background. It returns at once; call
// WaitSynced to wait for the first complete membership.
func WatchKube(cfg KubeConfig, t *Table) (*Kube, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if t == nil {
		return nil, fmt.Errorf("%w: nil table", ErrKubeConfig)
	}
	ctx, cancel := context.WithCancel(context.Background())
	selector := labels.Set{discoveryv1.LabelServiceName: cfg.Service}.String()
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.Resync,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Discovery().V1().EndpointSlices()
	k := &Kube{
		cfg:     cfg,
		table:   t,
		factory: factory,
		lister:  inf.Lister(),
		cancel:  cancel,
		kick:    make(chan struct{}, 1),
		started: make(chan struct{}),
	}
	informer := inf.Informer()
	k.synced = informer.HasSynced
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("membership: kubernetes informer: %w", err)
	}
	factory.Start(ctx.Done())
	k.wg.Go(func() { k.loop(ctx) })
	return k, nil
}

func (k *Kube) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// loop rebuilds the table after the initial sync and after every change.
func (k *Kube) loop(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), k.synced) {
		return
	}
	k.rebuild()
	close(k.started)
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
			k.rebuild()
		}
	}
}

// WaitSynced waits until the table holds the membership of the initial
// list from the API server, or ctx ends.
func (k *Kube) WaitSynced(ctx context.Context) error {
	select {
	case <-k.started:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("membership: EndpointSlices of service %s/%s not synced: %w", k.cfg.Namespace, k.cfg.Service, ctx.Err())
	}
}

// Close stops the watch and waits for its goroutines. The table keeps its
// last membership. Close is idempotent.
func (k *Kube) Close() error {
	k.once.Do(func() {
		k.cancel()
		k.factory.Shutdown()
		k.wg.Wait()
	})
	return nil
}

func (k *Kube) rebuild() {
	eps, err := k.lister.EndpointSlices(k.cfg.Namespace).List(labels.Everything())
	if err != nil { // a lister over an in-memory cache does not fail; keep the table
		k.cfg.Logger.Error("membership: list EndpointSlices", "err", err)
		return
	}
	entries, skipped := KubeEntries(eps, k.cfg.PortName, k.cfg.IDOffset)
	for _, s := range skipped {
		k.cfg.Logger.Debug("membership: endpoint skipped", "service", k.cfg.Service, "endpoint", s.Endpoint, "reason", s.Reason)
	}
	if err := k.table.Set(entries); err != nil { // KubeEntries only returns valid entries
		k.cfg.Logger.Error("membership: set table", "err", err)
		return
	}
	added, removed := diff(k.last, entries)
	if len(added) > 0 || len(removed) > 0 {
		k.cfg.Logger.Info("membership changed", "source", "kubernetes", "service", k.cfg.Service,
			"members", len(entries), "added", added, "removed", removed)
	}
	k.last = entries
}

// diff returns "id=addr" strings for entries added (or moved) and removed.
func diff(old, cur map[uint32]netip.AddrPort) (added, removed []string) {
	for id, ap := range cur {
		if prev, ok := old[id]; !ok || prev != ap {
			added = append(added, strconv.FormatUint(uint64(id), 10)+"="+ap.String())
		}
	}
	for id, ap := range old {
		if _, ok := cur[id]; !ok {
			removed = append(removed, strconv.FormatUint(uint64(id), 10)+"="+ap.String())
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	return added, removed
}

// Skipped names an endpoint KubeEntries left out and why.
type Skipped struct {
	Endpoint string // hostname, pod name or first address
	Reason   string
}

// KubeEntries computes the membership of a Service from its EndpointSlices
// (see the comment at the top of this file). It is pure, so it can be
// tested and used without a cluster. When two endpoints yield the same id,
// a ready one wins over a terminating one, then IPv4 over IPv6, then the
// lower address, so the result does not depend on the order of slices.
func KubeEntries(eps []*discoveryv1.EndpointSlice, portName string, idOffset uint32) (map[uint32]netip.AddrPort, []Skipped) {
	type cand struct {
		ap    netip.AddrPort
		ready bool
	}
	better := func(a, b cand) bool { // a better than b
		if a.ready != b.ready {
			return a.ready
		}
		if a.ap.Addr().Is4() != b.ap.Addr().Is4() {
			return a.ap.Addr().Is4()
		}
		return a.ap.Compare(b.ap) < 0
	}
	best := map[uint32]cand{}
	var skipped []Skipped
	for _, es := range eps {
		if es == nil || (es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		port, ok := slicePort(es, portName)
		if !ok {
			skipped = append(skipped, Skipped{es.Name, fmt.Sprintf("EndpointSlice has no UDP port named %q", portName)})
			continue
		}
		for _, ep := range es.Endpoints {
			name := endpointName(ep)
			ready, terminating := conditions(ep)
			if !ready && !terminating {
				skipped = append(skipped, Skipped{name, "not ready"})
				continue
			}
			id, err := IDFromHostname(name, idOffset)
			if err != nil {
				skipped = append(skipped, Skipped{name, err.Error()})
				continue
			}
			if len(ep.Addresses) == 0 {
				skipped = append(skipped, Skipped{name, "no address"})
				continue
			}
			// Every address of one endpoint is the same pod; the first is
			// the one the API documents consumers should use.
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || a.Zone() != "" {
				skipped = append(skipped, Skipped{name, fmt.Sprintf("address %q is not an IP", ep.Addresses[0])})
				continue
			}
			ap, err := canonical(netip.AddrPortFrom(a, port))
			if err != nil {
				skipped = append(skipped, Skipped{name, err.Error()})
				continue
			}
			c := cand{ap, ready}
			if prev, dup := best[id]; !dup || better(c, prev) {
				best[id] = c
			}
		}
	}
	out := make(map[uint32]netip.AddrPort, len(best))
	for id, c := range best {
		out[id] = c.ap
	}
	return out, skipped
}

// slicePort returns the UDP port named name in es.
func slicePort(es *discoveryv1.EndpointSlice, name string) (uint16, bool) {
	for _, p := range es.Ports {
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			continue
		}
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolUDP {
			continue
		}
		if p.Name != nil && *p.Name == name {
			return uint16(*p.Port), true
		}
	}
	return 0, false
}

// conditions reads an endpoint's conditions the way the API documents
// them: an unknown (nil) ready means ready; terminating defaults to false.
func conditions(ep discoveryv1.Endpoint) (ready, terminating bool) {
	ready = ep.Conditions.Ready == nil || *ep.Conditions.Ready
	terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
	return ready, terminating
}

func endpointName(ep discoveryv1.Endpoint) string {
	switch {
	case ep.Hostname != nil && *ep.Hostname != "":
		return *ep.Hostname
	case ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && ep.TargetRef.Name != "":
		return ep.TargetRef.Name
	case len(ep.Addresses) > 0:
		return ep.Addresses[0]
	}
	return ""
}

// IDFromHostname returns the transceiver id of a StatefulSet pod: the
// ordinal after the last '-' of its hostname (or pod name) plus offset.
// The id must be 1 to 4294967295 (0 is never a transceiver id).
func IDFromHostname(name string, offset uint32) (uint32, error) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 || i == len(name)-1 {
		return 0, fmt.Errorf("%w: %q has no -<ordinal> suffix (is it a StatefulSet pod behind its headless Service?)", ErrInvalid, name)
	}
	n, err := strconv.ParseUint(name[i+1:], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: ordinal %q is not a decimal number below 2^32", ErrInvalid, name, name[i+1:])
	}
	id := n + uint64(offset)
	if id == 0 || id > 1<<32-1 {
		return 0, fmt.Errorf("%w: %q: ordinal %d + offset %d is not a transceiver id (1-4294967295)", ErrInvalid, name, n, offset)
	}
	return uint32(id), nil
}
