package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "switchboard"
	releaseName = "sb"
	releaseNS   = "voice"
	// kubeVersion is the cluster version the chart is rendered for; the
	// chart needs 1.28+ (StatefulSet ordinals, pod-index label).
	kubeVersion = "v1.31.0"
)

// rendered is one render of the chart: every object, decoded strictly
// into its Kubernetes API type, by kind and name.
type rendered struct {
	objs  []runtime.Object
	byKey map[string]runtime.Object // "Kind/name"
	crs   map[string]map[string]any // custom resources (monitoring.coreos.com), "Kind/name"
	files map[string]string         // template → output
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// render renders the chart with values.yaml overlaid by vals, as
// `helm install sb -n voice --set …` would.
func render(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	ch := loadChart(t)
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "31"}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: releaseNS, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	r := &rendered{byKey: map[string]runtime.Object{}, crs: map[string]map[string]any{}, files: files}
	names := slices.Sorted(maps.Keys(files))
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		if err := r.decode(t, name, files[name]); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, files[name])
		}
	}
	return r, nil
}

// strict decodes JSON into the registered Go type, failing on unknown or
// duplicate fields, as `kubectl apply --validate=strict` would.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

func (r *rendered) decode(t *testing.T, name, content string) error {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(content)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return fmt.Errorf("not YAML: %w", err)
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(js, &meta); err != nil {
			return err
		}
		key := meta.Kind + "/" + meta.Metadata.Name
		if _, dup := r.byKey[key]; dup {
			return fmt.Errorf("%s rendered twice", key)
		}
		if _, dup := r.crs[key]; dup {
			return fmt.Errorf("%s rendered twice", key)
		}
		if strings.HasPrefix(meta.APIVersion, "monitoring.coreos.com/") {
			if err := decodeCR(meta.Kind, js); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			var m map[string]any
			_ = json.Unmarshal(js, &m)
			r.crs[key] = m
			continue
		}
		obj, _, err := strict.Decode(js, nil, nil)
		if err != nil {
			return fmt.Errorf("%s does not validate against the API types: %w", key, err)
		}
		r.objs = append(r.objs, obj)
		r.byKey[key] = obj
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if l := bytes.TrimSpace(line); len(l) > 0 && l[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

func get[T runtime.Object](t *testing.T, r *rendered, kind, name string) T {
	t.Helper()
	obj, ok := r.byKey[kind+"/"+name]
	if !ok {
		t.Fatalf("%s/%s not rendered; have %v", kind, name, r.keys())
	}
	v, ok := obj.(T)
	if !ok {
		t.Fatalf("%s/%s is a %T", kind, name, obj)
	}
	return v
}

func (r *rendered) keys() []string {
	ks := slices.Collect(maps.Keys(r.byKey))
	ks = append(ks, slices.Collect(maps.Keys(r.crs))...)
	sort.Strings(ks)
	return ks
}

// withPublicIP is the one value a default install must set.
func withPublicIP(extra map[string]any) map[string]any {
	v := map[string]any{"publicIP": "203.0.113.10"}
	maps.Copy(v, extra)
	return v
}

// customValues exercises every switch the defaults leave off.
func customValues() map[string]any {
	return map[string]any{
		"publicIP":         "2001:db8::10",
		"cluster":          7,
		"fullnameOverride": "voice-edge",
		"image":            map[string]any{"repository": "registry.example.com/switchboard", "tag": "v9.9.9"},
		"tokenKeys":        map[string]any{"existingSecret": "fleet-keys"},
		"auth":             map[string]any{"existingSecret": "signaling-auth", "tokenTTL": "2m"},
		"relay": map[string]any{
			"kind":        "DaemonSet",
			"ports":       map[string]any{"public": 13478, "internal": 13479, "metrics": 19090},
			"tokenMaxAge": "24h",
			"service":     map[string]any{"port": 443, "loadBalancerIP": "2001:db8::10", "annotations": map[string]any{"example.com/lb-type": "nlb"}, "loadBalancerSourceRanges": []any{"0.0.0.0/0"}},
			"hpa":         map[string]any{"enabled": true}, // ignored for a DaemonSet
			"extraEnv": []any{
				map[string]any{"name": "SWITCHBOARD_LOG_FORMAT", "value": "text"},
			},
			"nodeSelector": map[string]any{"switchboard.io/edge": "true"},
			"tolerations":  []any{map[string]any{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}},
		},
		"transceiver": map[string]any{
			"replicas":     5,
			"idStart":      100,
			"ports":        map[string]any{"hop": 14000, "http": 18080},
			"backendURL":   "wss://brain.example.com/v1/bridge",
			"allowRelays":  "10.0.0.0/8,fd00::/8",
			"drainSeconds": 1800,
			// Behind the Ingress: offers are counted per client, not per
			// Ingress controller pod.
			"trustedProxies":      "10.0.0.0/8",
			"maxPendingPerClient": 8,
			"consentTimeout":      "20s",
			"outputComplexity":    8,
			"ptime":               10,
			"dtlsVersion":         "1.2",
			"sped":                false,
			"hpa":                 map[string]any{"enabled": false},
			"ingress": map[string]any{
				"enabled":   true,
				"className": "nginx",
				"hosts":     []any{map[string]any{"host": "voice.example.org", "paths": []any{map[string]any{"path": "/v1", "pathType": "Prefix"}}}},
				"tls":       []any{map[string]any{"hosts": []any{"voice.example.org"}, "secretName": "voice-tls"}},
			},
		},
		"agent":    map[string]any{"enabled": false},
		"director": map[string]any{"enabled": true, "mode": "redirect"},
		"redis":    map[string]any{"enabled": true},
		"metrics": map[string]any{
			"serviceMonitor": map[string]any{"enabled": true},
			"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus"}},
		},
	}
}

func TestRenderDefaults(t *testing.T) {
	r, err := render(t, withPublicIP(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"Deployment/sb-switchboard-agent",
		"Deployment/sb-switchboard-relay",
		"HorizontalPodAutoscaler/sb-switchboard-transceiver",
		"PodDisruptionBudget/sb-switchboard-relay",
		"PodDisruptionBudget/sb-switchboard-transceiver",
		"Role/sb-switchboard-relay",
		"RoleBinding/sb-switchboard-relay",
		"Secret/sb-switchboard-token-keys",
		"Service/sb-switchboard-agent",
		"Service/sb-switchboard-relay",
		"Service/sb-switchboard-relay-metrics",
		"Service/sb-switchboard-transceiver",
		"Service/sb-switchboard-transceiver-hop",
		"ServiceAccount/sb-switchboard-relay",
		"StatefulSet/sb-switchboard-transceiver",
	}
	if got := r.keys(); !slices.Equal(got, want) {
		t.Fatalf("rendered\n  %v\nwant\n  %v", got, want)
	}
	checkAll(t, r, withPublicIP(nil))
}

func TestRenderCustom(t *testing.T) {
	vals := customValues()
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ConfigMap/voice-edge-director",
		"DaemonSet/voice-edge-relay",
		"Deployment/voice-edge-director",
		"Deployment/voice-edge-redis",
		"Ingress/voice-edge",
		"PodDisruptionBudget/voice-edge-relay",
		"PodDisruptionBudget/voice-edge-transceiver",
		"PrometheusRule/voice-edge",
		"Role/voice-edge-relay",
		"RoleBinding/voice-edge-relay",
		"Service/voice-edge-director",
		"Service/voice-edge-redis",
		"Service/voice-edge-relay",
		"Service/voice-edge-relay-metrics",
		"Service/voice-edge-transceiver",
		"Service/voice-edge-transceiver-hop",
		"ServiceAccount/voice-edge-relay",
		"ServiceMonitor/voice-edge-relay",
		"ServiceMonitor/voice-edge-transceiver",
		"StatefulSet/voice-edge-transceiver",
	}
	if got := r.keys(); !slices.Equal(got, want) {
		t.Fatalf("rendered\n  %v\nwant\n  %v", got, want)
	}
	checkAll(t, r, vals)

	// Values that only the custom render shows.
	sts := get[*appsv1.StatefulSet](t, r, "StatefulSet", "voice-edge-transceiver")
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 5 {
		t.Errorf("transceiver replicas = %v, want 5 with the HPA off", sts.Spec.Replicas)
	}
	env := envMap(sts.Spec.Template.Spec.Containers[0])
	if got := env["SWITCHBOARD_ADVERTISE"].Value; got != "[2001:db8::10]:443" {
		t.Errorf("advertise = %q, want [2001:db8::10]:443", got)
	}
	if got := env["SWITCHBOARD_BACKEND"].Value; got != "wss://brain.example.com/v1/bridge" {
		t.Errorf("backend = %q", got)
	}
	if got := env["SWITCHBOARD_ALLOW_RELAYS"].Value; got != "10.0.0.0/8,fd00::/8" {
		t.Errorf("allow-relays = %q", got)
	}
	if got := env["SWITCHBOARD_TRUSTED_PROXIES"].Value; got != "10.0.0.0/8" {
		t.Errorf("trusted-proxies = %q", got)
	}
	if got := env["SWITCHBOARD_MAX_PENDING_PER_CLIENT"].Value; got != "8" {
		t.Errorf("max-pending-per-client = %q", got)
	}
	if got := sts.Spec.Template.Spec.Containers[0].Image; got != "registry.example.com/switchboard:v9.9.9" {
		t.Errorf("image = %q", got)
	}
	ing := get[*networkingv1.Ingress](t, r, "Ingress", "voice-edge")
	if b := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service; b.Name != "voice-edge-director" || b.Port.Name != "http" {
		t.Errorf("ingress backend = %+v, want the director when it is enabled", b)
	}
	// The director's default config lists every transceiver by its stable
	// DNS name, and parses as the director's YAML.
	cm := get[*corev1.ConfigMap](t, r, "ConfigMap", "voice-edge-director")
	var dcfg struct {
		DefaultRegion string              `json:"default_region"`
		Regions       map[string]any      `json:"regions"`
		Clusters      map[string][]string `json:"clusters"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["director.yaml"]), &dcfg); err != nil {
		t.Fatalf("director.yaml: %v", err)
	}
	urls := dcfg.Clusters["local"]
	if len(urls) != 5 || urls[0] != "http://voice-edge-transceiver-100.voice-edge-transceiver-hop.voice.svc:18080" || urls[4] != "http://voice-edge-transceiver-104.voice-edge-transceiver-hop.voice.svc:18080" {
		t.Errorf("director cluster URLs = %v", urls)
	}
	dir := get[*appsv1.Deployment](t, r, "Deployment", "voice-edge-director")
	if got := envMap(dir.Spec.Template.Spec.Containers[0])["SWITCHBOARD_DIRECTOR_MODE"].Value; got != "redirect" {
		t.Errorf("director mode = %q", got)
	}
	svc := get[*corev1.Service](t, r, "Service", "voice-edge-relay")
	if svc.Spec.LoadBalancerIP != "2001:db8::10" || svc.Annotations["example.com/lb-type"] != "nlb" || len(svc.Spec.LoadBalancerSourceRanges) != 1 {
		t.Errorf("relay service = %+v", svc.Spec)
	}
	ds := get[*appsv1.DaemonSet](t, r, "DaemonSet", "voice-edge-relay")
	if ds.Spec.Template.Spec.NodeSelector["switchboard.io/edge"] != "true" || len(ds.Spec.Template.Spec.Tolerations) != 1 {
		t.Errorf("relay node placement = %v %v", ds.Spec.Template.Spec.NodeSelector, ds.Spec.Template.Spec.Tolerations)
	}
	if _, ok := r.byKey["HorizontalPodAutoscaler/voice-edge-relay"]; ok {
		t.Error("an HPA for a DaemonSet")
	}
}

func TestRenderRelayHPA(t *testing.T) {
	vals := withPublicIP(map[string]any{"relay": map[string]any{"hpa": map[string]any{"enabled": true}}})
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	hpa := get[*autoscalingv2.HorizontalPodAutoscaler](t, r, "HorizontalPodAutoscaler", "sb-switchboard-relay")
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != "sb-switchboard-relay" {
		t.Errorf("relay HPA target = %+v", hpa.Spec.ScaleTargetRef)
	}
	if d := get[*appsv1.Deployment](t, r, "Deployment", "sb-switchboard-relay"); d.Spec.Replicas != nil {
		t.Errorf("relay Deployment sets replicas (%d) while the HPA owns them", *d.Spec.Replicas)
	}
	checkAll(t, r, vals)
}

// TestRenderFlowCacheSecret: a flow cache URL with a password comes from
// a Secret, never the pod spec, even with the chart's Redis on.
func TestRenderFlowCacheSecret(t *testing.T) {
	vals := withPublicIP(map[string]any{
		"relay": map[string]any{"flowCache": "redis://plain:6379", "flowCacheSecret": "relay-redis"},
		"redis": map[string]any{"enabled": true},
	})
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, r, vals)
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name    string
		vals    map[string]any
		wantErr string
	}{
		{"no publicIP", nil, "publicIP is required"},
		{"no backend", withPublicIP(map[string]any{"agent": map[string]any{"enabled": false}}), "transceiver.backendURL is required"},
		{"relay kind", withPublicIP(map[string]any{"relay": map[string]any{"kind": "ReplicaSet"}}), "relay.kind must be Deployment or DaemonSet"},
		{"id 0", withPublicIP(map[string]any{"transceiver": map[string]any{"idStart": 0}}), "idStart must be at least 1"},
		{"same key ids", withPublicIP(map[string]any{"tokenKeys": map[string]any{"key": "a", "previousKey": "b", "keyId": 3, "previousKeyId": 3}}), "must differ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, tt.vals)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestKubeVersion(t *testing.T) {
	ch := loadChart(t)
	for v, want := range map[string]bool{"v1.27.9": false, "v1.28.0": true, "v1.31.0": true, "v1.35.1-gke.100": true} {
		if got := chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, v); got != want {
			t.Errorf("kubeVersion %q accepts %s: %v, want %v (StatefulSet ordinals and the pod-index label need 1.28)", ch.Metadata.KubeVersion, v, got, want)
		}
	}
}

// TestValuesDocumented checks that every value in values.yaml has a
// comment there and a row in docs/operations.md.
func TestValuesDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(b, &vals); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range valuePaths("", vals) {
		if !strings.Contains(string(doc), "`"+path+"`") {
			t.Errorf("value %s has no row in docs/operations.md", path)
		}
	}
}

// freeForm values are maps handed to Kubernetes as they are; they are
// documented as a whole.
var freeForm = map[string]bool{
	"resources": true, "annotations": true, "podAnnotations": true, "nodeSelector": true,
	"affinity": true, "config": true, "labels": true,
}

func valuePaths(prefix string, v map[string]any) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if m, ok := v[k].(map[string]any); ok && !freeForm[k] {
			out = append(out, valuePaths(p, m)...)
			continue
		}
		out = append(out, p)
	}
	return out
}

func envMap(c corev1.Container) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// Unused-import guards for types only some checks name.
var (
	_ = policyv1.PodDisruptionBudget{}
	_ = rbacv1.Role{}
	_ = validation.IsDNS1123Label
)
