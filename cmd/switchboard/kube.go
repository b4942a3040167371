package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/switchboard-rtc/switchboard/internal/membership"
)

// Membership sources a relay can fill its table from (-membership).
const (
	membershipStatic     = "static"
	membershipKubernetes = "kubernetes"
)

// kubeSyncTimeout bounds the wait for the first list of EndpointSlices at
// start-up: the relay serves /ready only after it, and exits (so that the
// kubelet restarts it) if the API server does not answer in time.
const kubeSyncTimeout = time.Minute

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// MembershipConfig selects and configures the relay's membership source.
type MembershipConfig struct {
	Source     string `yaml:"membership"`
	Kubeconfig string `yaml:"kubeconfig"`
	Namespace  string `yaml:"kube_namespace"`
	Service    string `yaml:"kube_service"`
	PortName   string `yaml:"kube_port"`
	IDOffset   uint   `yaml:"kube_id_offset"`
}

func (m *MembershipConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&m.Source, "membership", membershipStatic, "membership source: static (-members) or kubernetes (EndpointSlices of -kube-service)")
	fs.StringVar(&m.Kubeconfig, "kubeconfig", "", "kubeconfig file for -membership kubernetes (empty: the in-cluster service account)")
	fs.StringVar(&m.Namespace, "kube-namespace", "", "namespace of -kube-service (empty: the pod's own namespace)")
	fs.StringVar(&m.Service, "kube-service", "", "headless Service of the transceiver StatefulSet, for -membership kubernetes")
	fs.StringVar(&m.PortName, "kube-port", membership.DefaultKubePortName, "name of the internal-hop UDP port in that Service")
	fs.UintVar(&m.IDOffset, "kube-id-offset", 0, "transceiver id = pod ordinal + this offset")
}

// relayMembership builds the relay's membership table from the configured
// source. With kubernetes it waits for the first complete membership and
// keeps the table current in the background until the returned stop
// function is called.
func relayMembership(ctx context.Context, m MembershipConfig, static string, reg prometheus.Registerer, log *slog.Logger) (*membership.Table, func(), error) {
	switch m.Source {
	case membershipStatic, "":
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
		registerMembers(reg, t, membershipStatic)
		return t, func() {}, nil
	case membershipKubernetes:
	default:
		return nil, nil, fmt.Errorf("-membership %q: want static or kubernetes", m.Source)
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
	registerMembers(reg, t, membershipKubernetes)
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
