package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/switchboard-rtc/switchboard/internal/membership"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/kube"
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// The relays' Kubernetes membership against a real control plane
// (internal/testsupport/kube): the chart installed with Helm, the relay
// and the transceivers run as the switchboard binary with the
// environment the chart gives their pods (resolved from the API server
// as a kubelet does: the downward API, the Secret the chart created),
// the relay authenticated as the chart's ServiceAccount (not an admin),
// EndpointSlices made by the real EndpointSlice controller from pods the
// real StatefulSet controller creates. There is no kubelet: the test
// does its part through the API (binding, pod status) and runs each
// pod's process inside one network namespace, at the pod's IP
// (10.78.0.0/24; the API server rejects loopback endpoint addresses).
// Each pod process binds its pod IP where the chart says 0.0.0.0: pods
// share this namespace, and on a node each has its own.

const (
	kubeNS      = "voice"
	kubeRelease = "sb"
	kubeHopSvc  = "sb-switchboard-transceiver-hop"
	kubeSTS     = "sb-switchboard-transceiver"
	kubeNode    = "node-1"
)

// cluster is the test's view of the control plane, the namespace and the
// processes it runs as pods.
type cluster struct {
	t     *testing.T
	bin   string
	ns    *kube.NetNS
	cp    *kube.ControlPlane
	http  *http.Client
	audio string
	relay *child
	pods  map[string]*podProc // by pod name
	gen   map[int]int         // ordinal → pod generation (new IP per generation)
	// figures: what changed → how long until the relay's membership had it
	figures []propagation
}

type podProc struct {
	name string
	uid  types.UID
	ip   netip.Addr
	proc *child
}

// propagation is one change's way: from the API write (since) to the
// EndpointSlices (as the test's own reads saw them) to the relay's table
// (as its log line's time says).
type propagation struct {
	what        string
	slice, took time.Duration
}

// startNS runs cmd (inside the namespace) as a child of the test.
func startNS(t *testing.T, cmd *exec.Cmd, env []string) *child {
	t.Helper()
	c := &child{cmd: cmd, log: &logbuf.Buffer{}, exited: make(chan struct{})}
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(c.stop)
	return c
}

// podIP is the address of ordinal's pod in its generation.
func (k *cluster) podIP(ordinal int) netip.Addr {
	return k.ns.Addr(10 + ordinal + 20*k.gen[ordinal])
}

// podEnv is what the kubelet would give the pod's one container, with
// 0.0.0.0 listen addresses bound to the pod's IP instead.
func (k *cluster) podEnv(pod *corev1.Pod, ip netip.Addr) []string {
	k.t.Helper()
	env, err := kube.ContainerEnv(k.t.Context(), k.cp.Client, pod, pod.Spec.Containers[0].Name)
	if err != nil {
		k.t.Fatal(err)
	}
	for i, e := range env {
		env[i] = strings.ReplaceAll(e, "=0.0.0.0:", "="+ip.String()+":")
	}
	return env
}

// waitPod waits until the controllers created pod name (a new one if it
// is not uid).
func (k *cluster) waitPod(name string, notUID types.UID) *corev1.Pod {
	k.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := k.cp.Client.CoreV1().Pods(kubeNS).Get(k.t.Context(), name, metav1.GetOptions{})
		if err == nil && p.UID != notUID && p.DeletionTimestamp == nil {
			return p
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("pod %s not created (%v)", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startTransceiver plays the kubelet for transceiver pod ordinal: binds
// it, starts the binary with the pod's environment at its IP, probes
// /ready as the chart's readinessProbe does, and reports the pod ready.
func (k *cluster) startTransceiver(ordinal int, notUID types.UID) time.Time {
	k.t.Helper()
	name := fmt.Sprintf("%s-%d", kubeSTS, ordinal)
	pod := k.waitPod(name, notUID)
	ip := k.podIP(ordinal)
	k.ns.AddAddr(ip)
	if err := kube.Bind(k.t.Context(), k.cp.Client, pod, kubeNode); err != nil {
		k.t.Fatal(err)
	}
	if err := kube.SetRunning(k.t.Context(), k.cp.Client, kubeNS, name, ip, false); err != nil {
		k.t.Fatal(err)
	}
	env := k.podEnv(pod, ip)
	if !slices.Contains(env, "SWITCHBOARD_ID="+strconv.Itoa(ordinal)) {
		k.t.Fatalf("pod %s: the chart's environment gives no SWITCHBOARD_ID=%d: %v", name, ordinal, env)
	}
	proc := startNS(k.t, k.ns.Command(k.bin, pod.Spec.Containers[0].Args...), env)
	pp := &podProc{name: name, uid: pod.UID, ip: ip, proc: proc}
	k.pods[name] = pp
	return k.probeReady(pp)
}

// probeReady waits for the process's /ready, then sets the pod's Ready
// condition, as the kubelet's readiness probe does. It returns when it
// reported the pod ready.
func (k *cluster) probeReady(pp *podProc) time.Time {
	k.t.Helper()
	url := "http://" + netip.AddrPortFrom(pp.ip, 8080).String() + "/ready"
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := k.http.Get(url)
		if err == nil {
			resp.Body.Close()
			if probeOK(resp.StatusCode) {
				break
			}
		}
		select {
		case <-pp.proc.exited:
			k.t.Fatalf("%s exited:\n%s", pp.name, pp.proc.log.String())
		default:
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: %s not ready (%v):\n%s", pp.name, url, err, pp.proc.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ready := time.Now()
	if err := kube.SetRunning(k.t.Context(), k.cp.Client, kubeNS, pp.name, pp.ip, true); err != nil {
		k.t.Fatal(err)
	}
	return ready
}

// stopPod plays the kubelet for a pod being deleted: SIGTERM, wait for
// the process to exit (its drain), then remove the pod object.
func (k *cluster) stopPod(name string) {
	k.t.Helper()
	pp := k.pods[name]
	pp.proc.stop()
	if err := kube.ForceDelete(k.t.Context(), k.cp.Client, kubeNS, name); err != nil {
		k.t.Fatal(err)
	}
	delete(k.pods, name)
}

// membership is the relay's membership as its log tells it: the
// "membership from kubernetes" start line, then every "membership
// changed" line applied in order. at is the time of the last change.
func (k *cluster) membership() (members map[uint32]netip.AddrPort, at time.Time) {
	members = map[uint32]netip.AddrPort{}
	sc := bufio.NewScanner(strings.NewReader(k.relay.log.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Time    time.Time `json:"time"`
			Msg     string    `json:"msg"`
			Added   []string  `json:"added"`
			Removed []string  `json:"removed"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "membership changed" {
			continue
		}
		for _, r := range line.Removed {
			id, _, _ := parseMember(r)
			delete(members, id)
		}
		for _, a := range line.Added {
			if id, ap, ok := parseMember(a); ok {
				members[id] = ap
			}
		}
		at = line.Time
	}
	return members, at
}

func parseMember(s string) (uint32, netip.AddrPort, bool) {
	id, addr, ok := strings.Cut(s, "=")
	n, err := strconv.ParseUint(id, 10, 32)
	ap, err2 := netip.ParseAddrPort(addr)
	return uint32(n), ap, ok && err == nil && err2 == nil
}

// want waits until the relay's membership is exactly the pods named by
// ordinal (at their current IPs) and records how long it took from
// since.
func (k *cluster) want(what string, since time.Time, ordinals ...int) {
	k.t.Helper()
	want := map[uint32]netip.AddrPort{}
	for _, o := range ordinals {
		want[uint32(o)] = netip.AddrPortFrom(k.podIP(o), 4000)
	}
	deadline := time.Now().Add(time.Minute)
	var sliceAt time.Time
	for {
		if sliceAt.IsZero() {
			if maps.Equal(k.sliceMembers(), want) {
				sliceAt = time.Now()
			}
		}
		got, at := k.membership()
		if maps.Equal(got, want) && !sliceAt.IsZero() {
			p := propagation{what, sliceAt.Sub(since), at.Sub(since)}
			k.figures = append(k.figures, p)
			k.t.Logf("%-44s → EndpointSlices after %v, relay membership %v after %v", what,
				p.slice.Round(time.Millisecond), slices.Sorted(maps.Keys(got)), p.took.Round(time.Millisecond))
			return
		}
		select {
		case <-k.relay.exited:
			k.t.Fatalf("the relay exited:\n%s", k.relay.log.String())
		default:
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: relay membership %v, want %v\nrelay log:\n%s\nslices: %s", what, got, want, k.relay.log.Tail(6000), k.slices())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sliceMembers is the membership the hop Service's EndpointSlices give
// now, read with the admin credential (nil if the read fails).
func (k *cluster) sliceMembers() map[uint32]netip.AddrPort {
	ctx, cancel := context.WithTimeout(k.t.Context(), 2*time.Second)
	defer cancel()
	l, err := k.cp.Client.DiscoveryV1().EndpointSlices(kubeNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + kubeHopSvc})
	if err != nil {
		return nil
	}
	eps := make([]*discoveryv1.EndpointSlice, len(l.Items))
	for i := range l.Items {
		eps[i] = &l.Items[i]
	}
	m, _ := membership.KubeEntries(eps, "hop", 0)
	return m
}

// slices describes the hop Service's EndpointSlices, for failures.
func (k *cluster) slices() string {
	l, err := k.cp.Client.DiscoveryV1().EndpointSlices(kubeNS).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + kubeHopSvc})
	if err != nil {
		return err.Error()
	}
	b, _ := json.Marshal(l.Items)
	return string(b)
}

// call places a call through the relay to the transceiver of ordinal, by
// its own signaling address (as the Service would pick it): the answer's
// token names that transceiver, so the media reach it only if the
// relay's membership routes the id to its current address.
func (k *cluster) call(ordinal int) {
	k.t.Helper()
	url := "http://" + netip.AddrPortFrom(k.podIP(ordinal), 8080).String() + "/v1/calls"
	cmd := k.ns.Command(k.bin, "call", url, "-audio", k.audio, "-duration", "1s")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"audio_echoed": true`) {
		k.t.Fatalf("call to transceiver %d through the relay: %v\n%s\nrelay log:\n%s", ordinal, err, out, k.relay.log.Tail(4000))
	}
}

func (k *cluster) scale(n int32) {
	k.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	if _, err := k.cp.Client.AppsV1().StatefulSets(kubeNS).Patch(k.t.Context(), kubeSTS, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// waitTerminating waits until the EndpointSlice controller publishes the
// pod's endpoint as terminating.
func (k *cluster) waitTerminating(name string) {
	k.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := k.cp.Client.DiscoveryV1().EndpointSlices(kubeNS).List(k.t.Context(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + kubeHopSvc})
		if err == nil {
			for _, s := range l.Items {
				for _, ep := range s.Endpoints {
					if ep.TargetRef != nil && ep.TargetRef.Name == name && ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
						return
					}
				}
			}
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s never terminating in the EndpointSlices: %s", name, k.slices())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKubeMembership: a relay under the chart's own RBAC follows the
// transceivers through scale up and down, a pod deleted (draining, then
// gone, then recreated at a new IP), readiness lost and regained and an
// API server restart; after each change a call routed by token reaches
// the right transceiver process.
func TestKubeMembership(t *testing.T) {
	bin := testBinary(t)
	ns := kube.NewNetNS(t)
	cp := kube.Start(t, kube.Options{NetNS: ns})
	audio, err := filepath.Abs("../../testdata/speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	k := &cluster{
		t: t, bin: bin, ns: ns, cp: cp, audio: audio,
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: ns.DialContext}},
		pods: map[string]*podProc{},
		gen:  map[int]int{},
	}
	defer k.http.CloseIdleConnections()
	defer func() {
		if t.Failed() {
			for name, p := range k.pods {
				t.Logf("%s log:\n%s", name, p.proc.log.Tail(4000))
			}
		}
	}()
	ctx := t.Context()
	c := cp.Client
	if err := kube.CreateNode(ctx, c, kubeNode, ns.Addr(1)); err != nil {
		t.Fatal(err)
	}

	// The backend: the echo agent.
	agentIP := ns.Addr(2)
	ns.AddAddr(agentIP)
	startNS(t, ns.Command(bin, "agent", "-mode", "echo", "-listen", agentIP.String()+":8081"), nil)
	relayIP := ns.Addr(3)
	ns.AddAddr(relayIP)

	h := kube.NewHelm(t, cp, "../../deploy/switchboard", kubeRelease, kubeNS)
	h.Install(t, map[string]any{
		"publicIP": relayIP.String(),
		"agent":    map[string]any{"enabled": false},
		"director": map[string]any{"enabled": true, "replicas": 1},
		"relay":    map[string]any{"replicas": 1, "tcp": map[string]any{"enabled": false}},
		"transceiver": map[string]any{
			"replicas": 2, "hpa": map[string]any{"enabled": false},
			"backendURL":   "ws://" + agentIP.String() + ":8081/v1/bridge",
			"drainSeconds": 2,
		},
	})

	// The relay pod, from the chart's Deployment, with its ServiceAccount's
	// token (the namespace a pod reads from its token mount is given as
	// -kube-namespace).
	var relayPod *corev1.Pod
	for deadline := time.Now().Add(time.Minute); relayPod == nil; time.Sleep(50 * time.Millisecond) {
		l, err := c.CoreV1().Pods(kubeNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=relay"})
		if err == nil && len(l.Items) == 1 {
			relayPod = &l.Items[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("no relay pod: %v", err)
		}
	}
	if err := kube.Bind(ctx, c, relayPod, kubeNode); err != nil {
		t.Fatal(err)
	}
	saConfig := filepath.Join(t.TempDir(), "relay.kubeconfig")
	if err := cp.ServiceAccountKubeconfig(ctx, kubeNS, relayPod.Spec.ServiceAccountName, saConfig); err != nil {
		t.Fatal(err)
	}
	relayEnv := append(k.podEnv(relayPod, relayIP), "SWITCHBOARD_KUBECONFIG="+saConfig, "SWITCHBOARD_KUBE_NAMESPACE="+kubeNS)

	// Transceivers 1 and 2 from the StatefulSet, then the relay.
	k.startTransceiver(1, "")
	k.startTransceiver(2, "")
	start := time.Now()
	k.relay = startNS(t, ns.Command(bin, relayPod.Spec.Containers[0].Args...), relayEnv)
	k.want("relay start (list)", start, 1, 2)
	if err := kube.SetRunning(ctx, c, kubeNS, relayPod.Name, relayIP, true); err != nil {
		t.Fatal(err)
	}
	k.call(1)
	k.call(2)

	// Scale up: the StatefulSet controller creates pod 3.
	k.scale(3)
	since := k.startTransceiver(3, "")
	k.want("scale 2→3: pod 3 ready", since, 1, 2, 3)
	k.call(3)

	// Readiness lost and regained (the process keeps running).
	since = time.Now()
	if err := kube.SetRunning(ctx, c, kubeNS, kubeSTS+"-2", k.podIP(2), false); err != nil {
		t.Fatal(err)
	}
	k.want("pod 2 not ready", since, 1, 3)
	k.call(1)
	since = time.Now()
	if err := kube.SetRunning(ctx, c, kubeNS, kubeSTS+"-2", k.podIP(2), true); err != nil {
		t.Fatal(err)
	}
	k.want("pod 2 ready again", since, 1, 2, 3)
	k.call(2)

	// A pod deleted: bound to a node, it terminates gracefully; the
	// relay keeps it while it drains, drops it when it is gone, and
	// follows its replacement to its new IP.
	old := k.pods[kubeSTS+"-1"]
	if err := c.CoreV1().Pods(kubeNS).Delete(ctx, old.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.waitTerminating(old.name)
	time.Sleep(500 * time.Millisecond) // time for the relay to (wrongly) drop it
	if got, _ := k.membership(); got[1] != netip.AddrPortFrom(old.ip, 4000) {
		t.Fatalf("the relay dropped draining transceiver 1: membership %v", got)
	}
	since = time.Now()
	k.stopPod(old.name)
	k.want("pod 1 gone after its drain", since, 2, 3)
	k.gen[1]++
	since = k.startTransceiver(1, old.uid)
	k.want("pod 1 recreated at a new IP", since, 1, 2, 3)
	k.call(1)

	// Scale down: the StatefulSet controller deletes pod 3.
	k.scale(2)
	k.waitTerminating(kubeSTS + "-3")
	since = time.Now()
	k.stopPod(kubeSTS + "-3")
	k.want("scale 3→2: pod 3 gone", since, 1, 2)
	k.call(2)

	// Until now the relay's ServiceAccount was never refused.
	if n := k.relay.log.Count("forbidden"); n > 0 {
		t.Errorf("the relay was refused by RBAC %d times:\n%s", n, k.relay.log.String())
	}

	// The API server restarts under the relay's watch; changes made after
	// it is back still arrive. (A freshly started API server refuses
	// requests until its RBAC caches have loaded: the relay's first watch
	// may be "forbidden" once, and it retries.)
	if err := cp.RestartAPIServer(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	since = time.Now()
	if err := kube.SetRunning(ctx, c, kubeNS, kubeSTS+"-2", k.podIP(2), false); err != nil {
		t.Fatal(err)
	}
	k.want("API server restarted, then pod 2 not ready", since, 1)
	since = time.Now()
	if err := kube.SetRunning(ctx, c, kubeNS, kubeSTS+"-2", k.podIP(2), true); err != nil {
		t.Fatal(err)
	}
	k.want("pod 2 ready again", since, 1, 2)
	k.call(1)
	k.call(2)

	k.director()

	t.Logf("relay refused while the API server restarted: %d times", k.relay.log.Count("forbidden"))
	var steady []time.Duration
	for _, f := range k.figures[1:] {
		if !strings.Contains(f.what, "restarted") {
			steady = append(steady, f.took)
		}
	}
	slices.Sort(steady)
	t.Logf("membership propagation, API write → relay table: %d changes, median %v, max %v; after an API server restart: see above",
		len(steady), steady[len(steady)/2].Round(time.Millisecond), steady[len(steady)-1].Round(time.Millisecond))
}

// director plays the kubelet for the chart's director pod: its
// environment and its ConfigMap volume from the API server, and cluster
// DNS for the per-pod names its default config lists (written from the
// hop Service's EndpointSlices, as CoreDNS answers them). A call through
// it must reach a transceiver and, through the relay, connect.
func (k *cluster) director() {
	t := k.t
	ctx := t.Context()
	c := k.cp.Client
	var pod *corev1.Pod
	for deadline := time.Now().Add(time.Minute); pod == nil; time.Sleep(50 * time.Millisecond) {
		l, err := c.CoreV1().Pods(kubeNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=director"})
		if err == nil && len(l.Items) == 1 {
			pod = &l.Items[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("no director pod: %v", err)
		}
	}
	ip := k.ns.Addr(4)
	k.ns.AddAddr(ip)
	if err := kube.Bind(ctx, c, pod, kubeNode); err != nil {
		t.Fatal(err)
	}
	mounts, err := kube.MountConfigMaps(ctx, c, pod, pod.Spec.Containers[0].Name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Cluster DNS: <hostname>.<subdomain>.<namespace>.svc → pod IP, for
	// every endpoint of the hop Service (the names pods get from the
	// StatefulSet's serviceName).
	l, err := c.DiscoveryV1().EndpointSlices(kubeNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + kubeHopSvc})
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]netip.Addr{}
	for _, s := range l.Items {
		for _, ep := range s.Endpoints {
			if ep.Hostname != nil && len(ep.Addresses) > 0 {
				hosts[*ep.Hostname+"."+kubeHopSvc+"."+kubeNS+".svc"] = netip.MustParseAddr(ep.Addresses[0])
			}
		}
	}
	if err := k.ns.WriteHosts(hosts); err != nil {
		t.Fatal(err)
	}
	args := kube.MapPaths(pod.Spec.Containers[0].Args, mounts)
	d := startNS(t, k.ns.Command(k.bin, args...), k.podEnv(pod, ip))
	url := "http://" + netip.AddrPortFrom(ip, 8443).String()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := k.http.Get(url + "/ready")
		if err == nil {
			resp.Body.Close()
			if probeOK(resp.StatusCode) {
				break
			}
		}
		select {
		case <-d.exited:
			t.Fatalf("the director exited:\n%s", d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("director not ready (%v):\n%s", err, d.log.Tail(4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 2 {
		cmd := k.ns.Command(k.bin, "call", url+"/v1/calls", "-audio", k.audio, "-duration", "1s")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), `"audio_echoed": true`) {
			t.Fatalf("call %d through the director: %v\n%s\ndirector log:\n%s", i, err, out, d.log.Tail(4000))
		}
	}
}

// probeOK is the kubelet's reading of an HTTP probe: 200 to 399 passes.
func probeOK(code int) bool { return code >= 200 && code < 400 }
