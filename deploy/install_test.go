package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/kube"
)

// The chart installed on a real API server (etcd, kube-apiserver and
// kube-controller-manager of the Kubernetes release client-go pins, see
// internal/testsupport/kube): what offline rendering cannot show.

// warnings collects the API server's warnings (deprecated fields,
// unknown fields, …) for every request of the process while a test runs.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// helmEnv is one control plane and a Helm release of the chart on it.
type helmEnv struct {
	cp     *kube.ControlPlane
	helm   *kube.Helm
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func newHelmEnv(t *testing.T) *helmEnv {
	t.Helper()
	cp := kube.Start(t, kube.Options{})
	w := &warnings{}
	rest.SetDefaultWarningHandler(w)
	t.Cleanup(func() { rest.SetDefaultWarningHandler(rest.WarningLogger{}) })
	// The collector sees warnings: a deprecated node label in a pod (dry
	// run) draws one.
	if _, err := cp.Client.CoreV1().Pods("default").Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "warn"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"beta.kubernetes.io/arch": "amd64"},
			Containers:   []corev1.Container{{Name: "c", Image: "example.invalid/c"}},
		},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	if m := w.take(); len(m) == 0 {
		t.Fatal("no API warning collected for a deprecated node label: the warning checks below would pass blindly")
	}
	dc, err := dynamic.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return &helmEnv{cp: cp, helm: kube.NewHelm(t, cp, chartDir, releaseName, releaseNS), dyn: dc, warn: w}
}

// restMapper is built after CRDs are installed.
func (e *helmEnv) restMapper(t *testing.T) meta.RESTMapper {
	t.Helper()
	dc := kubernetes.NewForConfigOrDie(e.cp.Admin).Discovery()
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

func (e *helmEnv) install(t *testing.T, vals map[string]any) *release.Release {
	return e.helm.Install(t, vals)
}

func (e *helmEnv) upgrade(t *testing.T, vals map[string]any) *release.Release {
	return e.helm.Upgrade(t, vals)
}

func (e *helmEnv) uninstall(t *testing.T) { e.helm.Uninstall(t) }

// manifestObjects decodes a release's manifest.
func manifestObjects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	rd := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func (e *helmEnv) resource(t *testing.T, u *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	if e.mapper == nil {
		e.mapper = e.restMapper(t)
	}
	gvk := u.GroupVersionKind()
	m, err := e.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return e.dyn.Resource(m.Resource).Namespace(releaseNS)
	}
	return e.dyn.Resource(m.Resource)
}

// checkStored fetches every object of the manifest from the API server:
// each exists, was admitted with the release's labels, and came back
// with the server's defaults (the fields the manifest leaves out that
// the API server fills).
func (e *helmEnv) checkStored(t *testing.T, rel *release.Release) map[string]*unstructured.Unstructured {
	t.Helper()
	stored := map[string]*unstructured.Unstructured{}
	for _, u := range manifestObjects(t, rel.Manifest) {
		key := u.GetKind() + "/" + u.GetName()
		got, err := e.resource(t, u).Get(t.Context(), u.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s not on the API server after install: %v", key, err)
			continue
		}
		if got.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" || got.GetAnnotations()["meta.helm.sh/release-name"] != releaseName {
			t.Errorf("%s: not owned by the release: labels %v annotations %v", key, got.GetLabels(), got.GetAnnotations())
		}
		stored[key] = got
	}
	// Defaults only the API server applies.
	for key, u := range stored {
		switch u.GetKind() {
		case "Service":
			typ, _, _ := unstructured.NestedString(u.Object, "spec", "type")
			ip, _, _ := unstructured.NestedString(u.Object, "spec", "clusterIP")
			fam, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ipFamilies")
			if ip == "" || len(fam) == 0 {
				t.Errorf("%s: no clusterIP or ipFamilies defaulted (%q %v)", key, ip, fam)
			}
			if typ == "LoadBalancer" {
				if np, _, _ := unstructured.NestedSlice(u.Object, "spec", "ports"); len(np) == 0 || np[0].(map[string]any)["nodePort"] == nil {
					t.Errorf("%s: a LoadBalancer Service got no nodePort", key)
				}
			}
		case "StatefulSet", "Deployment", "DaemonSet":
			if n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "revisionHistoryLimit"); !ok || n != 10 {
				t.Errorf("%s: revisionHistoryLimit %d %v, want the server's default 10", key, n, ok)
			}
			ctrs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, c := range ctrs {
				if c.(map[string]any)["terminationMessagePolicy"] != "File" {
					t.Errorf("%s: container not defaulted by the server: %v", key, c)
				}
			}
		}
	}
	return stored
}

// waitPods waits until the controllers created the pods that match sel.
func waitPods(t *testing.T, c kubernetes.Interface, sel string, n int) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		pods, err := c.CoreV1().Pods(releaseNS).List(t.Context(), metav1.ListOptions{LabelSelector: sel})
		if err == nil && len(pods.Items) == n {
			slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
			return pods.Items
		}
		if time.Now().After(deadline) {
			var have []string
			if pods != nil {
				for _, p := range pods.Items {
					have = append(have, p.Name)
				}
			}
			var events []string
			if ev, err := c.CoreV1().Events(releaseNS).List(t.Context(), metav1.ListOptions{}); err == nil {
				for _, e := range ev.Items {
					events = append(events, fmt.Sprintf("%s %s/%s: %s %s", e.LastTimestamp.Format(time.TimeOnly), e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
				}
			}
			t.Fatalf("pods %q: have %v (err %v), want %d; events:\n  %s", sel, have, err, n, strings.Join(events, "\n  "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkPodsResolve checks what a kubelet would check before starting
// each pod's containers: the ServiceAccount exists, and every Secret,
// ConfigMap and downward API reference of the environment and the
// volumes resolves.
func checkPodsResolve(t *testing.T, c kubernetes.Interface, pods []corev1.Pod) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		if _, err := c.CoreV1().ServiceAccounts(releaseNS).Get(t.Context(), p.Spec.ServiceAccountName, metav1.GetOptions{}); err != nil {
			t.Errorf("pod %s: serviceaccount %q: %v", p.Name, p.Spec.ServiceAccountName, err)
		}
		for _, ctr := range p.Spec.Containers {
			if _, err := kube.ContainerEnv(t.Context(), c, p, ctr.Name); err != nil {
				t.Errorf("pod %s: %v", p.Name, err)
			}
			if _, err := kube.MountConfigMaps(t.Context(), c, p, ctr.Name, t.TempDir()); err != nil {
				t.Errorf("pod %s: %v", p.Name, err)
			}
		}
	}
}

// checkRelayRBAC asks the API server's authorizer what the relays'
// ServiceAccount may do: list and watch EndpointSlices in the release
// namespace (TestKubeMembership in cmd/switchboard shows that the relay
// needs no more), and nothing else the checks name.
func checkRelayRBAC(t *testing.T, c kubernetes.Interface, sa string) {
	t.Helper()
	user := "system:serviceaccount:" + releaseNS + ":" + sa
	for _, tt := range []struct {
		ns, group, resource, verb string
		want                      bool
	}{
		{releaseNS, "discovery.k8s.io", "endpointslices", "get", false}, // the informer never gets one
		{releaseNS, "discovery.k8s.io", "endpointslices", "list", true},
		{releaseNS, "discovery.k8s.io", "endpointslices", "watch", true},
		{releaseNS, "discovery.k8s.io", "endpointslices", "create", false},
		{releaseNS, "discovery.k8s.io", "endpointslices", "delete", false},
		{"kube-system", "discovery.k8s.io", "endpointslices", "list", false},
		{releaseNS, "", "secrets", "get", false},
		{releaseNS, "", "pods", "list", false},
		{releaseNS, "", "endpoints", "list", false},
	} {
		sar, err := c.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: tt.ns, Group: tt.group, Resource: tt.resource, Verb: tt.verb,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tt.want {
			t.Errorf("%s may %s %s in %s: %v, want %v (%s)", sa, tt.verb, tt.resource, tt.ns, sar.Status.Allowed, tt.want, sar.Status.Reason)
		}
	}
}

// checkGone waits until every object of the manifest is gone, except
// those the chart keeps on purpose (helm.sh/resource-policy: keep), and
// the pods the garbage collector removes with their owners.
func (e *helmEnv) checkGone(t *testing.T, rel *release.Release, kept map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, u := range manifestObjects(t, rel.Manifest) {
		key := u.GetKind() + "/" + u.GetName()
		for {
			_, err := e.resource(t, u).Get(t.Context(), u.GetName(), metav1.GetOptions{})
			if kept[key] {
				if err != nil {
					t.Errorf("%s, kept by its resource policy, is gone: %v", key, err)
				}
				break
			}
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s still there after uninstall (err %v)", key, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for {
		pods, err := e.cp.Client.CoreV1().Pods(releaseNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + releaseName})
		if err == nil && len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left after uninstall: %d (err %v)", len(pods.Items), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tokenKey(t *testing.T, c kubernetes.Interface, name string) string {
	t.Helper()
	s, err := c.CoreV1().Secrets(releaseNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(s.Data["token-key"])
}

func noWarnings(t *testing.T, w *warnings, step string) {
	t.Helper()
	if m := w.take(); len(m) > 0 {
		t.Errorf("%s: the API server warned:\n  %s", step, strings.Join(m, "\n  "))
	}
}

// TestInstallDefaults installs the chart with its defaults (plus the one
// required value), upgrades it, uninstalls it and installs it again.
func TestInstallDefaults(t *testing.T) {
	e := newHelmEnv(t)
	c := e.cp.Client
	vals := withPublicIP(nil)
	rel := e.install(t, vals)
	noWarnings(t, e.warn, "install")
	stored := e.checkStored(t, rel)
	offline, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(stored)), offline.keys(); !slices.Equal(got, want) {
		t.Errorf("installed %v\noffline render %v", got, want)
	}

	// The controllers act on the objects: the StatefulSet's ordinals
	// start at transceiver.idStart and each pod carries its index label,
	// which its -id comes from.
	tx := waitPods(t, c, "app.kubernetes.io/component=transceiver", 2)
	for i, p := range tx {
		want := fmt.Sprint(i + 1)
		if p.Name != "sb-switchboard-transceiver-"+want || p.Labels[appsv1.PodIndexLabel] != want {
			t.Errorf("transceiver pod %s has pod-index %q, want name …-%s and index %s", p.Name, p.Labels[appsv1.PodIndexLabel], want, want)
		}
		if p.Spec.Hostname != p.Name || p.Spec.Subdomain != "sb-switchboard-transceiver-hop" {
			t.Errorf("pod %s: hostname %q subdomain %q: not the per-pod DNS name the director uses", p.Name, p.Spec.Hostname, p.Spec.Subdomain)
		}
	}
	relays := waitPods(t, c, "app.kubernetes.io/component=relay", 2)
	agents := waitPods(t, c, "app.kubernetes.io/component=agent", 1)
	checkPodsResolve(t, c, slices.Concat(tx, relays, agents))
	checkRelayRBAC(t, c, "sb-switchboard-relay")
	key := tokenKey(t, c, "sb-switchboard-token-keys")
	if key == "" {
		t.Fatal("the generated token key is empty")
	}

	// Upgrade: more relays and transceivers, the HPA off; the generated
	// key survives (the chart looks it up in the cluster).
	vals = withPublicIP(map[string]any{
		"relay":       map[string]any{"replicas": 3},
		"transceiver": map[string]any{"replicas": 3, "hpa": map[string]any{"enabled": false}},
	})
	rel = e.upgrade(t, vals)
	noWarnings(t, e.warn, "upgrade")
	if rel.Version != 2 || rel.Info.Status != release.StatusDeployed {
		t.Errorf("upgrade: revision %d status %s", rel.Version, rel.Info.Status)
	}
	e.checkStored(t, rel)
	if _, err := c.AutoscalingV2().HorizontalPodAutoscalers(releaseNS).Get(t.Context(), "sb-switchboard-transceiver", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the transceivers' HPA is still there after it was turned off: %v", err)
	}
	waitPods(t, c, "app.kubernetes.io/component=transceiver", 3)
	waitPods(t, c, "app.kubernetes.io/component=relay", 3)
	if got := tokenKey(t, c, "sb-switchboard-token-keys"); got != key {
		t.Error("helm upgrade replaced the generated token key: every live session's token would stop routing")
	}

	e.uninstall(t)
	noWarnings(t, e.warn, "uninstall")
	e.checkGone(t, rel, map[string]bool{"Secret/sb-switchboard-token-keys": true})

	// Installed again, the release adopts the kept Secret and its key.
	rel = e.install(t, withPublicIP(nil))
	noWarnings(t, e.warn, "second install")
	if got := tokenKey(t, c, "sb-switchboard-token-keys"); got != key {
		t.Error("a new install after uninstall drew a new token key instead of the kept one")
	}
	e.uninstall(t)
	e.checkGone(t, rel, map[string]bool{"Secret/sb-switchboard-token-keys": true})
}

// monitoringCRDs defines the two Prometheus Operator kinds the chart can
// create. The operator's own CRDs (and their schemas) are not available
// offline, so these accept any spec: the API server checks the kinds,
// scope and metadata, and monitoring_test.go checks the fields.
func monitoringCRDs(t *testing.T, cp *kube.ControlPlane) {
	t.Helper()
	ac := kube.APIExtensions(t, cp)
	preserve := true
	for _, k := range []struct{ kind, plural string }{{"ServiceMonitor", "servicemonitors"}, {"PrometheusRule", "prometheusrules"}} {
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: k.plural + ".monitoring.coreos.com"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "monitoring.coreos.com",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: k.kind, Plural: k.plural, ListKind: k.kind + "List", Singular: strings.ToLower(k.kind)},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"spec": {Type: "object", XPreserveUnknownFields: &preserve},
						},
					}},
				}},
			},
		}
		if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kube.WaitCRDs(t, ac, "servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")
}

// TestInstallCustom installs the chart with the values of TestRenderCustom
// (every switch the defaults leave off: DaemonSet relays, the director,
// Redis, the Ingress, ServiceMonitors, IPv6 VIP, Secrets of your own),
// upgrades it and uninstalls it.
func TestInstallCustom(t *testing.T) {
	e := newHelmEnv(t)
	c := e.cp.Client
	monitoringCRDs(t, e.cp)
	// The Secrets the values name: the user creates them first.
	if _, err := c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]map[string]string{
		"fleet-keys":     {"token-key": "c3dpdGNoYm9hcmQtdGVzdC1mbGVldC1rZXktMzItYnl0ZXM=", "token-key-id": "3"},
		"signaling-auth": {"signing-key": "c3dpdGNoYm9hcmQtdGVzdC1zaWduLWtleS0zMi1ieXRlcw==", "api-keys": "test-api-key-with-at-least-32-bytes-of-text"},
	} {
		if _, err := c.CoreV1().Secrets(releaseNS).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: data,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// DaemonSet pods exist only for nodes (no kubelet runs on it).
	if err := kube.CreateNode(t.Context(), c, "edge-1", netipMust("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Patch(t.Context(), "edge-1", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"switchboard.io/edge":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	vals := customValues()
	rel := e.install(t, vals)
	noWarnings(t, e.warn, "install")
	stored := e.checkStored(t, rel)
	offline, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(stored)), offline.keys(); !slices.Equal(got, want) {
		t.Errorf("installed %v\noffline render %v", got, want)
	}
	tx := waitPods(t, c, "app.kubernetes.io/component=transceiver", 5)
	for i, p := range tx {
		if want := fmt.Sprint(100 + i); p.Labels[appsv1.PodIndexLabel] != want || p.Name != "voice-edge-transceiver-"+want {
			t.Errorf("pod %s pod-index %q, want %s", p.Name, p.Labels[appsv1.PodIndexLabel], want)
		}
	}
	relays := waitPods(t, c, "app.kubernetes.io/component=relay", 1) // one node
	directors := waitPods(t, c, "app.kubernetes.io/component=director", 2)
	redis := waitPods(t, c, "app.kubernetes.io/component=redis", 1)
	checkPodsResolve(t, c, slices.Concat(tx, relays, directors, redis))
	checkRelayRBAC(t, c, "voice-edge-relay")

	vals["transceiver"].(map[string]any)["replicas"] = 6
	vals["director"].(map[string]any)["mode"] = "proxy"
	rel = e.upgrade(t, vals)
	noWarnings(t, e.warn, "upgrade")
	e.checkStored(t, rel)
	waitPods(t, c, "app.kubernetes.io/component=transceiver", 6)

	e.uninstall(t)
	noWarnings(t, e.warn, "uninstall")
	e.checkGone(t, rel, nil)
}

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }
