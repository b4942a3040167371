package deploy

import (
	"encoding/base64"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/switchboard-rtc/switchboard/internal/config"
	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/relay"
	"github.com/switchboard-rtc/switchboard/internal/token"
	"github.com/switchboard-rtc/switchboard/internal/transceiver"
)

// workload is a pod-owning object, reduced to what the checks need.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	tmpl       corev1.PodTemplateSpec
}

func (r *rendered) workloads() []workload {
	var out []workload
	for _, o := range r.objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", o.Name, o.Spec.Selector, o.Spec.Template})
		case *appsv1.DaemonSet:
			out = append(out, workload{"DaemonSet", o.Name, o.Spec.Selector, o.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", o.Name, o.Spec.Selector, o.Spec.Template})
		}
	}
	return out
}

// component returns the one workload whose pods carry the component label.
func (r *rendered) component(t *testing.T, name string) workload {
	t.Helper()
	var found []workload
	for _, w := range r.workloads() {
		if w.tmpl.Labels["app.kubernetes.io/component"] == name {
			found = append(found, w)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d workloads of component %s", len(found), name)
	}
	return found[0]
}

// values merges the chart's values.yaml with the overrides of one render.
func values(t *testing.T, over map[string]any) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	merge(v, over)
	return v
}

func merge(dst, src map[string]any) {
	for k, sv := range src {
		if sm, ok := sv.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = sv
	}
}

// val reads a dotted path from values.
func val(t *testing.T, v map[string]any, path string) any {
	t.Helper()
	var cur any = v
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("value %s: %s is not a map", path, p)
		}
		cur = m[p]
	}
	return cur
}

func valInt(t *testing.T, v map[string]any, path string) int {
	t.Helper()
	switch n := val(t, v, path).(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	t.Fatalf("value %s = %v is not a number", path, val(t, v, path))
	return 0
}

func portOf(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

func containerPort(t *testing.T, c corev1.Container, name string) corev1.ContainerPort {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return corev1.ContainerPort{}
}

// checkAll runs every check that holds for any render of the chart.
func checkAll(t *testing.T, r *rendered, over map[string]any) {
	t.Helper()
	v := values(t, over)
	t.Run("objects", func(t *testing.T) { checkObjects(t, r) })
	t.Run("pods", func(t *testing.T) { checkPods(t, r, config.FlagSets()) })
	t.Run("services", func(t *testing.T) { checkServices(t, r) })
	t.Run("disruption and scaling", func(t *testing.T) { checkPDBAndHPA(t, r) })
	t.Run("relay", func(t *testing.T) { checkRelay(t, r, v) })
	t.Run("transceiver ids and membership", func(t *testing.T) { checkTransceiverIDs(t, r, v) })
	t.Run("transceiver", func(t *testing.T) { checkTransceiver(t, r, v) })
	t.Run("agent and director", func(t *testing.T) { checkHTTPListen(t, r, v) })
	t.Run("token keys", func(t *testing.T) { checkTokenKeys(t, r, v) })
	t.Run("signaling auth", func(t *testing.T) { checkAuth(t, r, v) })
	t.Run("rbac", func(t *testing.T) { checkRBAC(t, r) })
}

// checkObjects validates names and labels the way the API server does.
func checkObjects(t *testing.T, r *rendered) {
	for key, o := range r.byKey {
		m, err := metaOf(o)
		if err != nil {
			t.Fatal(err)
		}
		if errs := validation.IsDNS1123Subdomain(m.GetName()); len(errs) > 0 {
			t.Errorf("%s: name: %v", key, errs)
		}
		if _, ok := o.(*corev1.Service); ok {
			if errs := validation.IsDNS1035Label(m.GetName()); len(errs) > 0 {
				t.Errorf("%s: a Service name must be a DNS-1035 label: %v", key, errs)
			}
		}
		if ns := m.GetNamespace(); ns != "" && ns != releaseNS {
			t.Errorf("%s: namespace %q", key, ns)
		}
		checkLabels(t, key, m.GetLabels())
	}
	for _, w := range r.workloads() {
		checkLabels(t, w.kind+"/"+w.name+" pod template", w.tmpl.Labels)
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

func checkLabels(t *testing.T, where string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: label key %q: %v", where, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%q: %v", where, k, v, errs)
		}
	}
}

// checkPods checks every pod template: selectors, security, ports, probes,
// and that each switchboard container runs a real subcommand with flags
// (as SWITCHBOARD_<FLAG> variables) it has.
func checkPods(t *testing.T, r *rendered, sets map[string]*flag.FlagSet) {
	for _, w := range r.workloads() {
		where := w.kind + "/" + w.name
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(w.tmpl.Labels)) {
			t.Errorf("%s: selector %v does not match its pod labels %v (%v)", where, w.selector, w.tmpl.Labels, err)
		}
		ps := w.tmpl.Spec
		if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: pods may run as root", where)
		}
		for _, c := range ps.Containers {
			cw := where + " container " + c.Name
			if c.Image == "" {
				t.Errorf("%s: no image", cw)
			}
			names := map[string]bool{}
			for _, p := range c.Ports {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					t.Errorf("%s: port name %q: %v", cw, p.Name, errs)
				}
				if names[p.Name] {
					t.Errorf("%s: port %q twice", cw, p.Name)
				}
				names[p.Name] = true
			}
			for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Port.Type == intstr.String && !names[pr.HTTPGet.Port.StrVal] {
					t.Errorf("%s: probe on unknown port %q", cw, pr.HTTPGet.Port.StrVal)
				}
			}
			seen := map[string]bool{}
			for _, e := range c.Env {
				if seen[e.Name] {
					t.Errorf("%s: env %s twice", cw, e.Name)
				}
				seen[e.Name] = true
			}
			if c.Name == "redis" {
				continue
			}
			if len(c.Args) == 0 {
				t.Errorf("%s: no subcommand", cw)
				continue
			}
			if _, ok := sets[c.Args[0]]; !ok {
				t.Errorf("%s: switchboard has no server subcommand %q", cw, c.Args[0])
				continue
			}
			flags := flagsOf(t, sets, c.Args[0])
			byEnv := map[string]string{}
			for f := range flags {
				byEnv[config.CommandEnvName(c.Args[0], f)] = f
			}
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "SWITCHBOARD_") {
					if _, ok := byEnv[e.Name]; !ok {
						t.Errorf("%s: %s sets no flag of `switchboard %s` (flags: %v)", cw, e.Name, c.Args[0], keys(flags))
					}
				}
			}
			for _, a := range c.Args[1:] {
				if name, ok := strings.CutPrefix(a, "-"); ok {
					name, _, _ = strings.Cut(strings.TrimPrefix(name, "-"), "=")
					if _, ok := flags[name]; !ok {
						t.Errorf("%s: `switchboard %s` has no flag %s", cw, c.Args[0], a)
					}
				}
			}
		}
	}
}

// podsOf returns the workloads whose pods a selector picks.
func (r *rendered) podsOf(sel map[string]string) []workload {
	var out []workload
	if len(sel) == 0 {
		return nil
	}
	s := labels.SelectorFromSet(sel)
	for _, w := range r.workloads() {
		if s.Matches(labels.Set(w.tmpl.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// checkServices: each Service selects pods, and each port's targetPort is
// a container port of those pods with the same protocol.
func checkServices(t *testing.T, r *rendered) {
	for _, o := range r.objs {
		svc, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		ws := r.podsOf(svc.Spec.Selector)
		if len(ws) != 1 {
			t.Errorf("Service %s selects %d workloads", svc.Name, len(ws))
			continue
		}
		for _, sp := range svc.Spec.Ports {
			found := false
			for _, c := range ws[0].tmpl.Spec.Containers {
				for _, cp := range c.Ports {
					match := (sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal == cp.Name) ||
						(sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal == cp.ContainerPort)
					if match {
						found = true
						if cp.Protocol != sp.Protocol {
							t.Errorf("Service %s port %s is %s, container port %s is %s", svc.Name, sp.Name, sp.Protocol, cp.Name, cp.Protocol)
						}
					}
				}
			}
			if !found {
				t.Errorf("Service %s port %s: target %s is no container port of %s", svc.Name, sp.Name, sp.TargetPort.String(), ws[0].name)
			}
		}
	}
}

func checkPDBAndHPA(t *testing.T, r *rendered) {
	for _, o := range r.objs {
		switch o := o.(type) {
		case *policyv1.PodDisruptionBudget:
			if ws := r.podsOf(o.Spec.Selector.MatchLabels); len(ws) != 1 {
				t.Errorf("PDB %s selects %d workloads", o.Name, len(ws))
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			ref := o.Spec.ScaleTargetRef
			var target *workload
			for _, w := range r.workloads() {
				if w.kind == ref.Kind && w.name == ref.Name {
					target = &w
				}
			}
			if target == nil || ref.APIVersion != "apps/v1" {
				t.Errorf("HPA %s targets %s/%s (%s), which is not rendered", o.Name, ref.Kind, ref.Name, ref.APIVersion)
				continue
			}
			// CPU utilization needs CPU requests.
			for _, c := range target.tmpl.Spec.Containers {
				if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
					t.Errorf("HPA %s on CPU, but container %s requests no CPU", o.Name, c.Name)
				}
			}
			if o.Spec.MinReplicas == nil || *o.Spec.MinReplicas < 1 || o.Spec.MaxReplicas < *o.Spec.MinReplicas {
				t.Errorf("HPA %s: replicas %v..%d", o.Name, o.Spec.MinReplicas, o.Spec.MaxReplicas)
			}
		}
	}
}

// relayService returns the relay's LoadBalancer Service.
func relayService(t *testing.T, r *rendered) *corev1.Service {
	t.Helper()
	var out *corev1.Service
	for _, o := range r.objs {
		if s, ok := o.(*corev1.Service); ok && s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			if out != nil {
				t.Fatal("two LoadBalancer Services")
			}
			out = s
		}
	}
	if out == nil {
		t.Fatal("no LoadBalancer Service")
	}
	return out
}

// hopService returns the transceivers' headless Service.
func hopService(t *testing.T, r *rendered) *corev1.Service {
	t.Helper()
	w := r.component(t, "transceiver")
	sts := get[*appsv1.StatefulSet](t, r, "StatefulSet", w.name)
	return get[*corev1.Service](t, r, "Service", sts.Spec.ServiceName)
}

func checkRelay(t *testing.T, r *rendered, v map[string]any) {
	w := r.component(t, "relay")
	c := w.tmpl.Spec.Containers[0]
	env := envMap(c)
	// The flow cache: relay.flowCache, else the chart's Redis Service.
	wantCache := fmt.Sprint(val(t, v, "relay.flowCache"))
	if wantCache == "" && val(t, v, "redis.enabled") == true {
		for key, o := range r.byKey {
			if s, ok := o.(*corev1.Service); ok && strings.HasSuffix(key, "-redis") {
				wantCache = fmt.Sprintf("%s:%d", s.Name, s.Spec.Ports[0].Port)
			}
		}
	}
	if sec := fmt.Sprint(val(t, v, "relay.flowCacheSecret")); sec != "" {
		e := env["SWITCHBOARD_FLOW_CACHE"]
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != sec || e.ValueFrom.SecretKeyRef.Key != "flow-cache" {
			t.Errorf("relay SWITCHBOARD_FLOW_CACHE = %+v, want Secret %s key flow-cache", e, sec)
		}
	} else if got := env["SWITCHBOARD_FLOW_CACHE"].Value; got != wantCache {
		t.Errorf("relay SWITCHBOARD_FLOW_CACHE = %q, want %q", got, wantCache)
	}
	// relay.tokenMaxAge reaches -token-max-age, and only when set.
	if want, got := fmt.Sprint(val(t, v, "relay.tokenMaxAge")), env["SWITCHBOARD_TOKEN_MAX_AGE"]; got.Value != want || (want == "") != (got.Name == "") {
		t.Errorf("relay SWITCHBOARD_TOKEN_MAX_AGE = %+v, want relay.tokenMaxAge %q", got, want)
	}
	svc := relayService(t, r)
	if svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Errorf("relay Service externalTrafficPolicy = %q, want Local", svc.Spec.ExternalTrafficPolicy)
	}
	tcpOn := fmt.Sprint(val(t, v, "relay.tcp.enabled")) == "true"
	if want := 1 + map[bool]int{true: 1}[tcpOn]; len(svc.Spec.Ports) != want {
		t.Fatalf("relay Service exposes %d ports, want %d (UDP, and TCP when relay.tcp.enabled)", len(svc.Spec.Ports), want)
	}
	if tcpOn {
		// ICE-TCP: the Service's TCP port, the container port and -tcp are one port.
		tp := svc.Spec.Ports[1]
		if tp.Protocol != corev1.ProtocolTCP || int(tp.Port) != valInt(t, v, "relay.service.tcpPort") {
			t.Errorf("relay Service TCP port = %d/%s, want %d/TCP", tp.Port, tp.Protocol, valInt(t, v, "relay.service.tcpPort"))
		}
		cp := containerPort(t, c, tp.TargetPort.StrVal)
		if got := portOf(t, env["SWITCHBOARD_TCP"].Value); got != cp.ContainerPort || cp.Protocol != corev1.ProtocolTCP || int(got) != valInt(t, v, "relay.ports.tcp") {
			t.Errorf("relay -tcp port %d, container port %d/%s, value %d", got, cp.ContainerPort, cp.Protocol, valInt(t, v, "relay.ports.tcp"))
		}
	} else if e := env["SWITCHBOARD_TCP"]; e.Name != "" {
		t.Errorf("relay.tcp.enabled false, but SWITCHBOARD_TCP = %q", e.Value)
	}
	sp := svc.Spec.Ports[0]
	if sp.Protocol != corev1.ProtocolUDP || int(sp.Port) != valInt(t, v, "relay.service.port") {
		t.Errorf("relay Service port = %d/%s, want %d/UDP", sp.Port, sp.Protocol, valInt(t, v, "relay.service.port"))
	}
	if ws := r.podsOf(svc.Spec.Selector); len(ws) != 1 || ws[0].name != w.name {
		t.Errorf("relay Service selects %v", ws)
	}
	// The Service's target, the container port and the flag are one port.
	pub := containerPort(t, c, sp.TargetPort.StrVal)
	if got := portOf(t, env["SWITCHBOARD_PUBLIC"].Value); got != pub.ContainerPort || int(got) != valInt(t, v, "relay.ports.public") {
		t.Errorf("relay -public port %d, container port %d, value %d", got, pub.ContainerPort, valInt(t, v, "relay.ports.public"))
	}
	if got := portOf(t, env["SWITCHBOARD_INTERNAL"].Value); got != containerPort(t, c, "internal").ContainerPort {
		t.Errorf("relay -internal port %d is not its container port", got)
	}
	metrics := containerPort(t, c, "metrics")
	if got := portOf(t, env["SWITCHBOARD_METRICS"].Value); got != metrics.ContainerPort {
		t.Errorf("relay -metrics port %d is not its container port %d", got, metrics.ContainerPort)
	}
	checkProbes(t, c, "metrics")
	// Relays listen on every pod address.
	for _, name := range []string{"SWITCHBOARD_PUBLIC", "SWITCHBOARD_INTERNAL", "SWITCHBOARD_METRICS"} {
		if h, _, _ := net.SplitHostPort(env[name].Value); h != "0.0.0.0" {
			t.Errorf("relay %s = %q listens on %q only", name, env[name].Value, h)
		}
	}
	if got := env["SWITCHBOARD_CLUSTER"].Value; got != fmt.Sprint(val(t, v, "cluster")) {
		t.Errorf("relay cluster %q, value %v", got, val(t, v, "cluster"))
	}
}

// checkProbes: liveness on /live, readiness on /ready, both on port.
func checkProbes(t *testing.T, c corev1.Container, port string) {
	t.Helper()
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/live"}, {"readiness", c.ReadinessProbe, "/ready"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", c.Name, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != port {
			t.Errorf("%s: %s probe on %s port %s, want %s on %s", c.Name, p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path, port)
		}
	}
}

// checkTransceiverIDs follows a transceiver's id from the chart to the
// relay's membership: the StatefulSet names pod <name>-N for ordinals from
// transceiver.idStart, the pod takes N as -id from its pod-index label, and
// a relay, given the EndpointSlice Kubernetes builds for the headless
// Service, maps id N to that pod's IP and the transceiver's -listen port.
func checkTransceiverIDs(t *testing.T, r *rendered, v map[string]any) {
	w := r.component(t, "transceiver")
	sts := get[*appsv1.StatefulSet](t, r, "StatefulSet", w.name)
	c := sts.Spec.Template.Spec.Containers[0]
	env := envMap(c)
	relayEnv := envMap(r.component(t, "relay").tmpl.Spec.Containers[0])
	hop := hopService(t, r)

	idStart := valInt(t, v, "transceiver.idStart")
	if sts.Spec.Ordinals == nil || int(sts.Spec.Ordinals.Start) != idStart {
		t.Fatalf("StatefulSet ordinals %+v, want start %d", sts.Spec.Ordinals, idStart)
	}
	id := env["SWITCHBOARD_ID"]
	if id.ValueFrom == nil || id.ValueFrom.FieldRef == nil || id.ValueFrom.FieldRef.FieldPath != "metadata.labels['"+appsv1.PodIndexLabel+"']" {
		t.Fatalf("SWITCHBOARD_ID = %+v, want the pod's %s label", id, appsv1.PodIndexLabel)
	}
	if hop.Spec.ClusterIP != corev1.ClusterIPNone || hop.Spec.PublishNotReadyAddresses {
		t.Errorf("hop Service: clusterIP %q, publishNotReadyAddresses %v; want headless, ready pods only", hop.Spec.ClusterIP, hop.Spec.PublishNotReadyAddresses)
	}
	if got := relayEnv["SWITCHBOARD_MEMBERSHIP"].Value; got != "kubernetes" {
		t.Errorf("relay membership %q", got)
	}
	if got := relayEnv["SWITCHBOARD_KUBE_SERVICE"].Value; got != hop.Name {
		t.Errorf("relay watches Service %q, transceivers are behind %q", got, hop.Name)
	}
	portName := relayEnv["SWITCHBOARD_KUBE_PORT"].Value
	if portName != membership.DefaultKubePortName {
		t.Errorf("relay -kube-port %q, code default %q", portName, membership.DefaultKubePortName)
	}
	var hopPort *corev1.ServicePort
	for i, p := range hop.Spec.Ports {
		if p.Name == portName {
			hopPort = &hop.Spec.Ports[i]
		}
	}
	if hopPort == nil || hopPort.Protocol != corev1.ProtocolUDP {
		t.Fatalf("hop Service has no UDP port %q: %+v", portName, hop.Spec.Ports)
	}
	listen := portOf(t, env[config.CommandEnvName("transceiver", "listen")].Value)
	if cp := containerPort(t, c, hopPort.TargetPort.StrVal); cp.ContainerPort != listen || cp.Protocol != corev1.ProtocolUDP || int(listen) != valInt(t, v, "transceiver.ports.hop") {
		t.Errorf("transceiver -listen port %d, container port %+v, value %d", listen, cp, valInt(t, v, "transceiver.ports.hop"))
	}
	offset, err := strconv.ParseUint(relayEnv["SWITCHBOARD_KUBE_ID_OFFSET"].Value, 10, 32)
	if err != nil {
		t.Fatalf("relay -kube-id-offset: %v", err)
	}

	// The EndpointSlice the EndpointSlice controller writes for these pods:
	// hostname = pod name (the StatefulSet sets hostname and subdomain),
	// the port named and numbered as the Service's target resolves.
	replicas := 3
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: hop.Name + "-abcde", Namespace: releaseNS, Labels: map[string]string{discoveryv1.LabelServiceName: hop.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &hopPort.Name, Port: &listen, Protocol: &hopPort.Protocol}},
	}
	want := map[uint32]netip.AddrPort{}
	for i := range replicas {
		ordinal := idStart + i
		pod := fmt.Sprintf("%s-%d", sts.Name, ordinal)
		if errs := validation.IsDNS1123Label(pod); len(errs) > 0 {
			t.Errorf("pod name %s: %v", pod, errs)
		}
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i + 1)})
		ready := true
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{ip.String()}, Hostname: &pod,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: releaseNS},
		})
		// The pod's -id is its pod-index label, which is its ordinal.
		want[uint32(ordinal)] = netip.AddrPortFrom(ip, uint16(listen))
	}
	got, skipped := membership.KubeEntries([]*discoveryv1.EndpointSlice{es}, portName, uint32(offset))
	if len(skipped) > 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("relay membership from the chart's pods = %v (skipped %v), want %v", got, skipped, want)
	}
}

func checkTransceiver(t *testing.T, r *rendered, v map[string]any) {
	w := r.component(t, "transceiver")
	sts := get[*appsv1.StatefulSet](t, r, "StatefulSet", w.name)
	c := sts.Spec.Template.Spec.Containers[0]
	env := envMap(c)

	// Answers advertise the VIP: publicIP and the relay Service's port.
	svc := relayService(t, r)
	adv, err := netip.ParseAddrPort(env["SWITCHBOARD_ADVERTISE"].Value)
	if err != nil {
		t.Fatalf("advertise %q is not ip:port (the transceiver rejects host names): %v", env["SWITCHBOARD_ADVERTISE"].Value, err)
	}
	if adv.Addr() != netip.MustParseAddr(fmt.Sprint(val(t, v, "publicIP"))) || int32(adv.Port()) != svc.Spec.Ports[0].Port {
		t.Errorf("advertise %s, want publicIP %v and relay Service port %d", adv, val(t, v, "publicIP"), svc.Spec.Ports[0].Port)
	}
	// And its ICE-TCP port, when relays take TCP.
	if fmt.Sprint(val(t, v, "relay.tcp.enabled")) == "true" {
		tadv, err := netip.ParseAddrPort(env["SWITCHBOARD_ADVERTISE_TCP"].Value)
		if err != nil || tadv.Addr() != adv.Addr() || len(svc.Spec.Ports) < 2 || int32(tadv.Port()) != svc.Spec.Ports[1].Port {
			t.Errorf("advertise-tcp %q, want publicIP at the relay Service's TCP port", env["SWITCHBOARD_ADVERTISE_TCP"].Value)
		}
	} else if e := env["SWITCHBOARD_ADVERTISE_TCP"]; e.Name != "" {
		t.Errorf("relay.tcp.enabled false, but SWITCHBOARD_ADVERTISE_TCP = %q", e.Value)
	}
	http := containerPort(t, c, "http")
	if got := portOf(t, env["SWITCHBOARD_HTTP"].Value); got != http.ContainerPort || int(got) != valInt(t, v, "transceiver.ports.http") {
		t.Errorf("transceiver -http port %d, container port %d", got, http.ContainerPort)
	}
	checkProbes(t, c, "http")
	if got := env["SWITCHBOARD_CLUSTER"].Value; got != fmt.Sprint(val(t, v, "cluster")) {
		t.Errorf("transceiver cluster %q, value %v", got, val(t, v, "cluster"))
	}
	// The grace period covers the drain plus the HTTP shutdown (5 s in
	// serveHTTP), so the kubelet does not kill a draining transceiver.
	drain, err := time.ParseDuration(env["SWITCHBOARD_DRAIN_TIMEOUT"].Value)
	if err != nil {
		t.Fatalf("drain timeout: %v", err)
	}
	if drain != time.Duration(valInt(t, v, "transceiver.drainSeconds"))*time.Second {
		t.Errorf("drain %v, value %d s", drain, valInt(t, v, "transceiver.drainSeconds"))
	}
	grace := sts.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second < drain+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v does not cover the %v drain", ptrString(grace), drain)
	}
	if got, want := env["SWITCHBOARD_REPORT_INTERVAL"].Value, fmt.Sprint(val(t, v, "transceiver.reportInterval")); got != want {
		t.Errorf("report interval %q, value %q", got, want)
	}
	u := env["SWITCHBOARD_BACKEND"].Value
	if !strings.HasPrefix(u, "ws://") && !strings.HasPrefix(u, "wss://") {
		t.Errorf("backend %q is not a WebSocket URL", u)
	}
	// The signaling Service reaches the http port.
	sig := get[*corev1.Service](t, r, "Service", w.name)
	if len(sig.Spec.Ports) != 1 || sig.Spec.Ports[0].TargetPort.StrVal != "http" || sig.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("signaling Service ports %+v", sig.Spec.Ports)
	}
	if sts.Spec.ServiceName != hopService(t, r).Name {
		t.Errorf("StatefulSet serviceName %q", sts.Spec.ServiceName)
	}
	// Each value reaches its flag through the flag's environment variable.
	flags := flagsOf(t, config.FlagSets(), "transceiver")
	for _, s := range transceiverSettings {
		if _, ok := flags[s.flag]; !ok {
			t.Errorf("%s: `switchboard transceiver` has no -%s", s.value, s.flag)
		}
		name := config.CommandEnvName("transceiver", s.flag)
		if got, want := env[name].Value, fmt.Sprint(val(t, v, s.value)); got != want {
			t.Errorf("%s = %q, want %s's %q", name, got, s.value, want)
		}
	}
}

// transceiverSettings are the chart's transceiver values passed as one
// flag each, through the flag's environment variable (config.CommandEnvName),
// whose defaults are the binary's (TestDefaultsAgreeWithFlags). A flag
// neither here, nor mapped by the templates, nor in
// transceiverFlagsNotInChart fails TestTransceiverFlagsInChart.
var transceiverSettings = []struct{ value, flag string }{
	{"transceiver.maxSessions", "max-sessions"},
	{"transceiver.setupTimeout", "setup-timeout"},
	{"transceiver.checkTimeout", "check-timeout"},
	{"transceiver.maxPendingPerClient", "max-pending-per-client"},
	{"transceiver.maxPending", "max-pending"},
	{"transceiver.disconnectedTimeout", "disconnected-timeout"},
	{"transceiver.consentTimeout", "consent-timeout"},
	{"transceiver.outputBitrate", "output-bitrate"},
	{"transceiver.outputComplexity", "output-complexity"},
	{"transceiver.ptime", "ptime"},
	{"transceiver.dtlsVersion", "dtls-version"},
	{"transceiver.sped", "sped"},
}

// checkHTTPListen: the agent and the director, where the render runs
// them, listen (-listen, as SWITCHBOARD_AGENT_LISTEN and
// SWITCHBOARD_DIRECTOR_LISTEN) on the port of their value, which is their
// container's http port.
func checkHTTPListen(t *testing.T, r *rendered, v map[string]any) {
	for _, w := range r.workloads() {
		cmd := w.tmpl.Labels["app.kubernetes.io/component"]
		if cmd != "agent" && cmd != "director" {
			continue
		}
		c := w.tmpl.Spec.Containers[0]
		name := config.CommandEnvName(cmd, "listen")
		e, ok := envMap(c)[name]
		if !ok {
			t.Errorf("%s: no %s", w.name, name)
			continue
		}
		listen, http := portOf(t, e.Value), containerPort(t, c, "http")
		if listen != http.ContainerPort || http.Protocol != corev1.ProtocolTCP || int(listen) != valInt(t, v, cmd+".port") {
			t.Errorf("%s -listen port %d, container port %+v, %s.port %d", cmd, listen, http, cmd, valInt(t, v, cmd+".port"))
		}
	}
}

// checkTokenKeys: relays and transceivers read the fleet key from the same
// Secret under the key names the chart documents, as SWITCHBOARD_TOKEN_*
// (flags -token-key…), and a chart-made Secret holds a usable keyring.
func checkTokenKeys(t *testing.T, r *rendered, v map[string]any) {
	secretName := ""
	for _, comp := range []string{"relay", "transceiver"} {
		env := envMap(r.component(t, comp).tmpl.Spec.Containers[0])
		for _, k := range []struct {
			env, key string
			optional bool
		}{
			{"SWITCHBOARD_TOKEN_KEY", "token-key", false},
			{"SWITCHBOARD_TOKEN_KEY_ID", "token-key-id", true},
			{"SWITCHBOARD_TOKEN_PREVIOUS_KEY", "token-previous-key", true},
			{"SWITCHBOARD_TOKEN_PREVIOUS_KEY_ID", "token-previous-key-id", true},
		} {
			e := env[k.env]
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: %s is not from a Secret", comp, k.env)
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			if ref.Key != k.key || (ref.Optional != nil && *ref.Optional) != k.optional {
				t.Errorf("%s: %s from key %q (optional %v), want %q (optional %v)", comp, k.env, ref.Key, ref.Optional, k.key, k.optional)
			}
			if secretName == "" {
				secretName = ref.Name
			} else if ref.Name != secretName {
				t.Errorf("%s: %s from Secret %q, others from %q", comp, k.env, ref.Name, secretName)
			}
		}
	}
	if ex := fmt.Sprint(val(t, v, "tokenKeys.existingSecret")); ex != "" {
		if secretName != ex {
			t.Errorf("keys read from %q, existingSecret is %q", secretName, ex)
		}
		if _, ok := r.byKey["Secret/"+ex]; ok {
			t.Errorf("the chart renders the existing Secret %q", ex)
		}
		return
	}
	sec := get[*corev1.Secret](t, r, "Secret", secretName)
	raw := sec.Data["token-key"]
	secret, err := base64.StdEncoding.DecodeString(string(raw))
	if err != nil || len(secret) < 32 {
		t.Fatalf("token-key %q is not 32 bytes in base64: %v", raw, err)
	}
	id, err := strconv.ParseUint(string(sec.Data["token-key-id"]), 10, 8)
	if err != nil {
		t.Fatalf("token-key-id %q: %v", sec.Data["token-key-id"], err)
	}
	if _, err := token.NewKeyring(token.Key{ID: uint8(id), Secret: secret}); err != nil {
		t.Fatalf("keyring from the Secret: %v", err)
	}
	// Pods roll when the chart-managed keys change.
	for _, comp := range []string{"relay", "transceiver"} {
		if r.component(t, comp).tmpl.Annotations["checksum/token-keys"] == "" {
			t.Errorf("%s pods have no checksum/token-keys annotation", comp)
		}
	}
}

// checkAuth: with auth.existingSecret, transceivers and the director read
// the signing key and API keys from it as SWITCHBOARD_AUTH_* (flags
// -auth-…); without it no pod gets them and signaling is open.
func checkAuth(t *testing.T, r *rendered, v map[string]any) {
	ex := fmt.Sprint(val(t, v, "auth.existingSecret"))
	comps := []string{"transceiver"}
	for _, w := range r.workloads() {
		if w.tmpl.Labels["app.kubernetes.io/component"] == "director" {
			comps = append(comps, "director")
		}
	}
	for _, comp := range comps {
		env := envMap(r.component(t, comp).tmpl.Spec.Containers[0])
		for _, k := range []struct{ env, key string }{
			{"SWITCHBOARD_AUTH_SIGNING_KEY", "signing-key"},
			{"SWITCHBOARD_AUTH_API_KEYS", "api-keys"},
			{"SWITCHBOARD_AUTH_PREVIOUS_SIGNING_KEY", "previous-signing-key"},
		} {
			e, ok := env[k.env]
			if ex == "" {
				if ok {
					t.Errorf("%s: %s set with auth off", comp, k.env)
				}
				continue
			}
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != ex || e.ValueFrom.SecretKeyRef.Key != k.key {
				t.Errorf("%s: %s = %+v, want Secret %s key %s", comp, k.env, e, ex, k.key)
			}
		}
		if ttl := env["SWITCHBOARD_AUTH_TOKEN_TTL"].Value; ex != "" && ttl != fmt.Sprint(val(t, v, "auth.tokenTTL")) {
			t.Errorf("%s: SWITCHBOARD_AUTH_TOKEN_TTL %q, want auth.tokenTTL", comp, ttl)
		}
	}
}

// checkRBAC: relays may list and watch EndpointSlices, nothing more.
func checkRBAC(t *testing.T, r *rendered) {
	w := r.component(t, "relay")
	sa := w.tmpl.Spec.ServiceAccountName
	get[*corev1.ServiceAccount](t, r, "ServiceAccount", sa)
	bound := false
	for _, o := range r.objs {
		rb, ok := o.(*rbacv1.RoleBinding)
		if !ok {
			continue
		}
		if !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == releaseNS
		}) {
			continue
		}
		role := get[*rbacv1.Role](t, r, "Role", rb.RoleRef.Name)
		for _, rule := range role.Rules {
			if slices.Contains(rule.APIGroups, discoveryv1.GroupName) && slices.Contains(rule.Resources, "endpointslices") &&
				slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
				bound = true
			}
			for _, verb := range rule.Verbs {
				if !slices.Contains([]string{"list", "watch"}, verb) {
					t.Errorf("Role %s grants %q", role.Name, verb)
				}
			}
		}
	}
	if !bound {
		t.Errorf("relay ServiceAccount %s may not list and watch endpointslices", sa)
	}
}

// TestDefaultsAgreeWithFlags: the chart's default ports are the binary's
// defaults, so the docs, the README and a bare `switchboard relay` agree.
func TestDefaultsAgreeWithFlags(t *testing.T) {
	v := values(t, nil)
	sets := config.FlagSets()
	for _, tt := range []struct {
		value, cmd, flag string
	}{
		{"relay.ports.public", "relay", "public"},
		{"relay.service.port", "relay", "public"},
		{"relay.ports.internal", "relay", "internal"},
		{"relay.ports.metrics", "relay", "metrics"},
		{"transceiver.ports.hop", "transceiver", "listen"},
		{"transceiver.ports.http", "transceiver", "http"},
		{"agent.port", "agent", "listen"},
		{"director.port", "director", "listen"},
	} {
		t.Run(tt.value, func(t *testing.T) {
			def := flagsOf(t, sets, tt.cmd)[tt.flag].DefValue
			if got := valInt(t, v, tt.value); int32(got) != portOf(t, def) {
				t.Errorf("%s = %d, `switchboard %s -%s` defaults to %s", tt.value, got, tt.cmd, tt.flag, def)
			}
		})
	}
	for _, s := range transceiverSettings {
		def := flagsOf(t, sets, "transceiver")[s.flag].DefValue
		got := fmt.Sprint(val(t, v, s.value))
		if d, err := time.ParseDuration(got); err == nil {
			got = d.String() // "30s" and "30s" alike, "1m" as "1m0s"
		}
		if got != def {
			t.Errorf("%s = %s, `switchboard transceiver -%s` defaults to %s", s.value, got, s.flag, def)
		}
	}
	if got := valInt(t, v, "relay.service.port"); got != 3478 {
		t.Errorf("the VIP port is %d, want STUN's 3478", got)
	}
	if got := valInt(t, v, "cluster"); got != 1 {
		t.Errorf("cluster %d, the binary's default is 1", got)
	}
	// The relay's flow timeouts default as in the binary, whose flags take
	// their defaults from the relay package's constants.
	flags := flagsOf(t, sets, "relay")
	for _, tt := range []struct {
		value, flag, constant string
		want                  time.Duration
	}{
		{"relay.pendingTimeout", "pending-timeout", "relay.DefaultPendingTimeout", relay.DefaultPendingTimeout},
		{"relay.idleTimeout", "idle-timeout", "relay.DefaultIdleTimeout", relay.DefaultIdleTimeout},
	} {
		d, err := time.ParseDuration(fmt.Sprint(val(t, v, tt.value)))
		if err != nil {
			t.Fatal(err)
		}
		if got := flags[tt.flag].DefValue; got != tt.want.String() {
			t.Errorf("-%s defaults to %s, want %s (%v)", tt.flag, got, tt.constant, tt.want)
		}
		if d != tt.want {
			t.Errorf("%s = %v, %s is %v", tt.value, d, tt.constant, tt.want)
		}
	}
	// The transceiver's RTCP report interval, likewise.
	d, err := time.ParseDuration(fmt.Sprint(val(t, v, "transceiver.reportInterval")))
	if err != nil {
		t.Fatal(err)
	}
	if def := flagsOf(t, sets, "transceiver")["report-interval"].DefValue; d.String() != def || d != transceiver.DefaultReportInterval {
		t.Errorf("transceiver.reportInterval = %v, -report-interval defaults to %s, transceiver.DefaultReportInterval is %v", d, def, transceiver.DefaultReportInterval)
	}
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
