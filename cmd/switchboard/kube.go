package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/switchboard-rtc/switchboard/internal/config"
	"github.com/switchboard-rtc/switchboard/internal/membership"
)

// kubeSyncTimeout bounds the wait for the first list of EndpointSlices at
// start-up: the relay serves /ready only after it, and exits (so that the
// kubelet restarts it) if the API server does not answer in time.
const kubeSyncTimeout = time.Minute

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// relayMembership builds the relay's membership table from the configured
// source. With kubernetes it waits for the first complete membership and
// keeps the table current in the background until the returned stop
// function is called.
func relayMembership(ctx context.Context, m config.Membership, static string, cluster uint16, reg prometheus.Registerer, log *slog.Logger) (*membership.Table, func(), error) {
	switch m.Source {
	case config.MembershipStatic, "":
		entries, err := membership.Static(static)
		if err != nil {
			return nil, nil, fmt.Errorf("-members: %w", err)
		}
		if len(entries) == 0 {
			return nil, nil, errors.New("-members is empty: list the transceivers this relay may route to, e.g. -members 1=127.0.0.1:4000 (or use -membership kubernetes)")
		}
		t, err := membership.NewTable(entries)
		if err != nil {
			return nil, nil, fmt.Errorf("-members: %w", err)
		}
		registerMembers(reg, t, config.MembershipStatic)
		return t, func() {}, nil
	case config.MembershipRedis:
		return redisMembership(ctx, m, static, cluster, reg, log)
	case config.MembershipKubernetes:
	default:
		return nil, nil, fmt.Errorf("-membership %q: want static, kubernetes or redis", m.Source)
	}
	if static != "" {
		return nil, nil, errors.New("-members and -membership kubernetes exclude each other: drop -members")
	}
	if m.IDOffset > 1<<32-1 {
		return nil, nil, errors.New("-kube-id-offset must be below 2^32")
	}
	ns := m.Namespace
	if ns == "" {
		b, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return nil, nil, fmt.Errorf("-kube-namespace is empty and the pod namespace is unknown (%w): set -kube-namespace", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	var rc *rest.Config
	var err error
	if m.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", m.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("-membership kubernetes: %w", err)
	}
	rc.UserAgent = "switchboard-relay"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("-membership kubernetes: %w", err)
	}
	t := new(membership.Table)
	k, err := membership.WatchKube(membership.KubeConfig{
		Client:    client,
		Namespace: ns,
		Service:   m.Service,
		PortName:  m.PortName,
		IDOffset:  uint32(m.IDOffset),
		Logger:    log,
	}, t)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, kubeSyncTimeout)
	defer cancel()
	if err := k.WaitSynced(sctx); err != nil {
		_ = k.Close()
		return nil, nil, err
	}
	registerMembers(reg, t, config.MembershipKubernetes)
	log.Info("membership from kubernetes", "namespace", ns, "service", m.Service, "port", m.PortName, "members", t.Len())
	return t, func() { _ = k.Close() }, nil
}

// registerMembers exports the table's size, so that an empty table (no
// transceiver to route to) can be alerted on.
func registerMembers(reg prometheus.Registerer, t *membership.Table, source string) {
	if reg == nil {
		return
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "switchboard_relay_members",
		Help:        "Transceivers in the relay's membership table.",
		ConstLabels: prometheus.Labels{"source": source},
	}, func() float64 { return float64(t.Len()) }))
}

// redisMembership fills the table from the Redis registry of cluster and
// keeps it current in the background. A Redis that is down at start-up is
// not fatal: the table starts empty (or from -members, if given) and fills
// once Redis answers.
func redisMembership(ctx context.Context, m config.Membership, static string, cluster uint16, reg prometheus.Registerer, log *slog.Logger) (*membership.Table, func(), error) {
	if m.Redis == "" {
		return nil, nil, errors.New("-membership redis needs -redis host:port")
	}
	t := new(membership.Table)
	if static != "" {
		entries, err := membership.Static(static)
		if err != nil {
			return nil, nil, fmt.Errorf("-members: %w", err)
		}
		if err := t.Set(entries); err != nil {
			return nil, nil, fmt.Errorf("-members: %w", err)
		}
	}
	client := redis.NewClient(&redis.Options{Addr: m.Redis})
	w, err := membership.WatchRedis(ctx, client, cluster, t, 0, log)
	if err != nil {
		log.Warn("membership registry unreachable at start; retrying in the background", "redis", m.Redis, "err", err)
	}
	registerMembers(reg, t, config.MembershipRedis)
	if reg != nil {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "switchboard_relay_membership_read_failures_total",
			Help: "Reads of the Redis membership registry that failed; the relay keeps its last table meanwhile.",
		}, func() float64 { return float64(w.Failures.Load()) }))
	}
	log.Info("membership from redis", "redis", m.Redis, "cluster", cluster, "members", t.Len())
	return t, func() { _ = w.Close(); _ = client.Close() }, nil
}
