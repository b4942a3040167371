package kube

import (
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	helmkube "helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/client-go/rest"
)

// Helm installs, upgrades and uninstalls one release of a chart on the
// control plane with the Helm SDK, as `helm install` does (releases
// stored in Secrets, the server's API checked before anything is sent).
type Helm struct {
	Chart, Release, Namespace string

	cfg *action.Configuration
}

// NewHelm returns a Helm for the chart in directory chart.
func NewHelm(t testing.TB, cp *ControlPlane, chart, releaseName, namespace string) *Helm {
	t.Helper()
	flags := helmkube.GetConfig(cp.AdminKubeconfig, "", namespace)
	if cp.ns != nil {
		dial := cp.ns.DialContext
		flags.WrapConfigFn = func(c *rest.Config) *rest.Config { c.Dial = dial; return c }
	}
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	return &Helm{Chart: chart, Release: releaseName, Namespace: namespace, cfg: cfg}
}

// Install is `helm install --create-namespace` with vals over the chart's
// values.yaml.
func (h *Helm) Install(t testing.TB, vals map[string]any) *release.Release {
	t.Helper()
	ch, err := loader.Load(h.Chart)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = h.Release, h.Namespace, true
	in.Timeout = 2 * time.Minute
	rel, err := in.Run(ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	return rel
}

// Upgrade is `helm upgrade` with vals over the chart's values.yaml.
func (h *Helm) Upgrade(t testing.TB, vals map[string]any) *release.Release {
	t.Helper()
	ch, err := loader.Load(h.Chart)
	if err != nil {
		t.Fatal(err)
	}
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.Namespace
	up.Timeout = 2 * time.Minute
	rel, err := up.Run(h.Release, ch, vals)
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	return rel
}

// Uninstall is `helm uninstall`.
func (h *Helm) Uninstall(t testing.TB) {
	t.Helper()
	un := action.NewUninstall(h.cfg)
	un.Timeout = 2 * time.Minute
	res, err := un.Run(h.Release)
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	if res.Info != "" {
		t.Logf("helm uninstall: %s", res.Info)
	}
}
