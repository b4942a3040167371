package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/switchboard-rtc/switchboard/internal/testsupport/kube"
)

// TestNode runs the chart on a real node (internal/testsupport/kube,
// StartNode): kubelet, containerd and runc start the chart's relay,
// transceiver, agent and Redis pods from images built here, on a bridge
// pod network, behind kube-proxy; a client outside the cluster (its own
// network namespace, linked to the node) calls through the relay
// Service's load balancer IP, then a relay pod is deleted under load.
// It runs only with SWITCHBOARD_KUBE_NODE=1 (scripts/kube-node.sh):
// it needs root, containerd, the node binaries and minutes.
func TestNode(t *testing.T) {
	if os.Getenv(kube.NodeEnv) == "" {
		t.Skipf("a real node: set %s=1 (scripts/kube-node.sh installs, builds and runs it)", kube.NodeEnv)
	}
	began := time.Now()
	ns := kube.NewNetNS(t)
	cp := kube.Start(t, kube.Options{
		NetNS: ns, ServeKubernetesService: true,
		// With a real kubelet renewing its lease, the node lifecycle
		// controller lifts the not-ready taint once the Node is Ready.
		MoreControllers: []string{"node-lifecycle-controller"},
	})
	node := kube.StartNode(t, cp, kube.NodeOptions{})
	t.Logf("control plane and node ready in %v", time.Since(began).Round(time.Millisecond))

	imagesFrom := time.Now()
	bin, files, cfg := kube.SwitchboardImage(t)
	const repo, tag = "localhost/switchboard-test/switchboard", "node-test"
	node.ImportImage(repo+":"+tag, files, cfg)
	const redisImage = "localhost/switchboard-test/redis:debian"
	rf, rc := kube.RedisImage(t)
	node.ImportImage(redisImage, rf, rc)
	t.Logf("images built and imported in %v", time.Since(imagesFrom).Round(time.Millisecond))

	// The VIP: the address a cloud's load balancer would give the relay
	// Service, routed to the node; kube-proxy sends it to the relays.
	vip := netip.MustParseAddr("10.80.0.1")
	small := func(cpu, mem string) map[string]any {
		return map[string]any{"requests": map[string]any{"cpu": cpu, "memory": mem}}
	}
	vals := map[string]any{
		"publicIP": vip.String(),
		"image":    map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		// The node has two CPUs: requests the chart's defaults would not
		// fit (1.5 CPUs of relays and 2 of transceivers).
		"relay": map[string]any{"resources": small("100m", "64Mi")},
		"transceiver": map[string]any{
			"hpa": map[string]any{"enabled": false}, "replicas": 2,
			"resources": small("100m", "128Mi"),
		},
		"redis": map[string]any{"enabled": true, "image": redisImage},
	}
	const ns1, release = "voice", "sb"
	h := kube.NewHelm(t, cp, chartDir, release, ns1)
	installed := time.Now()
	h.Install(t, vals)
	ctx := t.Context()
	c := cp.Client
	relaySvc := release + "-switchboard-relay"
	setLoadBalancerIP(t, cp, ns1, relaySvc, vip)
	pods := waitPodsReady(t, cp, ns1, 6, 4*time.Minute)
	t.Logf("helm install → %d pods Ready on the node in %v", len(pods), time.Since(installed).Round(time.Millisecond))
	for _, p := range pods {
		if p.Spec.NodeName != node.Name {
			t.Fatalf("pod %s on node %q, want %s", p.Name, p.Spec.NodeName, node.Name)
		}
		if !node.PodCIDR.Contains(netip.MustParseAddr(p.Status.PodIP)) {
			t.Fatalf("pod %s has IP %s, outside the pod network %s", p.Name, p.Status.PodIP, node.PodCIDR)
		}
	}
	sig, err := c.CoreV1().Services(ns1).Get(ctx, release+"-switchboard-transceiver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s:%d/v1/calls", sig.Spec.ClusterIP, sig.Spec.Ports[0].Port)
	client, clientIP := node.Client(t)
	t.Logf("client %s in namespace %s; signaling %s; relay VIP %s:3478", clientIP, client.Name, url, vip)

	// A call through the relay Service: signaling to the transceiver
	// Service's cluster IP, media to the VIP, both through kube-proxy.
	audio, err := filepath.Abs(filepath.Join("..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		out, err := client.Command(bin, "call", url, "-audio", audio, "-duration", "2s").Output()
		var r callReport
		if jerr := json.Unmarshal(out, &r); jerr != nil || err != nil {
			t.Fatalf("call %d through the relay Service: %v %v\n%s\nrelays:\n%s", i, err, jerr, out, podLogs(t, node, cp, ns1, "relay"))
		}
		t.Logf("call %d: signaling %.1f ms, ICE %.1f ms, DTLS %.1f ms, first audio %.1f ms; %d/%d packets echoed",
			i, r.Setup.SignalingMS, r.Setup.ICEConnectedMS, r.Setup.DTLSConnectedMS, r.Setup.FirstAudioMS, r.PacketsReceived, r.PacketsSent)
	}

	// Calls through the VIP, then a relay pod deleted under them.
	killRelayUnderLoad(t, cp, node, client, bin, url, ns1)
}

type callReport struct {
	Setup struct {
		SignalingMS     float64 `json:"signaling_ms"`
		ICEConnectedMS  float64 `json:"ice_connected_ms"`
		DTLSConnectedMS float64 `json:"dtls_connected_ms"`
		FirstAudioMS    float64 `json:"first_audio_ms"`
	} `json:"setup_ms"`
	PacketsSent     int     `json:"packets_sent"`
	PacketsReceived int     `json:"packets_received"`
	MaxGapMS        float64 `json:"max_gap_ms"`
}

// setLoadBalancerIP does what a cloud's load balancer controller does for
// a Service of type LoadBalancer: it reports the address it gave it.
func setLoadBalancerIP(t *testing.T, cp *kube.ControlPlane, ns, name string, ip netip.Addr) {
	t.Helper()
	svc, err := cp.Client.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Fatalf("service %s is %s, want LoadBalancer", name, svc.Spec.Type)
	}
	mode := corev1.LoadBalancerIPModeVIP
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String(), IPMode: &mode}}
	if _, err := cp.Client.CoreV1().Services(ns).UpdateStatus(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitPodsReady waits until want pods of ns exist, none terminating,
// all Ready, and returns them.
func waitPodsReady(t *testing.T, cp *kube.ControlPlane, ns string, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		list, err := cp.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		var notReady []string
		if err == nil {
			for _, p := range list.Items {
				if p.DeletionTimestamp != nil || !podReady(&p) {
					notReady = append(notReady, fmt.Sprintf("%s (%s%s)", p.Name, p.Status.Phase, waitingReason(&p)))
				}
			}
			if len(list.Items) == want && notReady == nil {
				return list.Items
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods Ready in %s after %v, want %d; not ready: %v (%v)", len(list.Items)-len(notReady), ns, timeout, want, notReady, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitingReason(p *corev1.Pod) string {
	var rs []string
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			rs = append(rs, w.Reason+": "+w.Message)
		}
		if s.RestartCount > 0 {
			rs = append(rs, fmt.Sprintf("%d restarts", s.RestartCount))
		}
	}
	if rs == nil {
		return ""
	}
	return ", " + strings.Join(rs, "; ")
}

// podLogs returns the kubelet's logs of the containers of component's
// pods (for a failure's message).
func podLogs(t *testing.T, node *kube.Node, cp *kube.ControlPlane, ns, component string) string {
	list, err := cp.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range list.Items {
		fmt.Fprintf(&b, "--- %s\n%s\n", p.Name, node.PodLog(&p, 30))
	}
	return b.String()
}

// loadEvent is a line of `switchboard load -connected-json`'s stdout: a
// "connected" event or, last, the summary.
type loadEvent struct {
	Event     string         `json:"event"`
	Sessions  int            `json:"sessions"`
	Connected int            `json:"connected"`
	OK        int            `json:"ok"`
	Failures  map[string]int `json:"failures"`
	Errors    map[string]string
	Loss      float64         `json:"loss"`
	MaxGapMS  json.RawMessage `json:"max_gap_ms"`
	MarkGapMS *struct {
		N   int     `json:"n"`
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
		Max float64 `json:"max"`
	} `json:"mark_gap_ms"`
	SetupMS *struct {
		N   int     `json:"n"`
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"setup_ms"`
}

// killRelayUnderLoad runs sessions through the VIP, deletes the relay
// pod that carries most of them (as `kubectl delete pod` does: graceful),
// and checks that every session lives on, reporting the audio gap.
func killRelayUnderLoad(t *testing.T, cp *kube.ControlPlane, node *kube.Node, client *kube.NetNS, bin, url, ns string) {
	t.Helper()
	const sessions = 10
	load := client.Command(bin, "load", url, "-sessions", strconv.Itoa(sessions), "-duration", "40s",
		"-ramp", "200ms", "-connected-json", "-progress", "0")
	stdout, err := load.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	load.Stderr = &stderr
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	events := make(chan loadEvent, sessions+1)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e loadEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				events <- e
			}
		}
	}()
	defer func() {
		if load.ProcessState == nil {
			_ = load.Process.Kill()
			_ = load.Wait()
		}
	}()
	connected := 0
	deadline := time.After(90 * time.Second)
	for connected < sessions {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("load ended with %d of %d sessions connected:\n%s", connected, sessions, stderr.String())
			}
			if e.Event == "connected" {
				connected++
			}
		case <-deadline:
			t.Fatalf("%d of %d sessions connected after 90 s:\n%s", connected, sessions, stderr.String())
		}
	}
	time.Sleep(3 * time.Second) // steady state: every session's flow on its relay

	relays, err := cp.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=relay"})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: node.DialContext}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	flows := map[string]float64{}
	var victim *corev1.Pod
	for i := range relays.Items {
		p := &relays.Items[i]
		m := relayMetrics(t, hc, p.Status.PodIP)
		flows[p.Name] = m["switchboard_relay_flows"]
		if victim == nil || flows[p.Name] > flows[victim.Name] {
			victim = p
		}
	}
	t.Logf("flows per relay before the kill: %v", flows)
	if flows[victim.Name] == 0 {
		t.Fatalf("no relay holds a flow of the %d sessions: %v", sessions, flows)
	}
	var survivor *corev1.Pod
	for i := range relays.Items {
		if relays.Items[i].Name != victim.Name {
			survivor = &relays.Items[i]
		}
	}
	before := relayMetrics(t, hc, survivor.Status.PodIP)

	// The fault: mark it in the load's figures, delete the pod.
	killed := time.Now()
	if err := load.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(t.Context(), victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted relay pod %s (%s, %v flows)", victim.Name, victim.Status.PodIP, flows[victim.Name])
	gone := waitPodGone(t, cp, ns, victim.Name, 2*time.Minute)
	t.Logf("relay pod %s gone %v after the delete", victim.Name, gone.Sub(killed).Round(time.Millisecond))

	var summary *loadEvent
	for e := range events {
		if e.Event == "" {
			summary = &e
		}
	}
	werr := load.Wait()
	if summary == nil {
		t.Fatalf("load printed no summary (%v):\n%s", werr, stderr.String())
	}
	after := relayMetrics(t, hc, survivor.Status.PodIP)
	delta := func(k string) float64 { return after[k] - before[k] }
	t.Logf("survivor %s: flows %v → %v, restored from the flow cache %v, created from a token %v, relearned %v",
		survivor.Name, before["switchboard_relay_flows"], after["switchboard_relay_flows"],
		delta("switchboard_relay_flows_restored_total"), delta("switchboard_relay_flows_created_total"), delta("switchboard_relay_flows_relearned_total"))
	if summary.MarkGapMS != nil {
		t.Logf("relay pod deleted under %d sessions: %d ok, failures %v, loss %.4f; audio gap across the kill p50 %.0f ms, p99 %.0f ms, max %.0f ms (n=%d)",
			summary.Sessions, summary.OK, summary.Failures, summary.Loss, summary.MarkGapMS.P50, summary.MarkGapMS.P99, summary.MarkGapMS.Max, summary.MarkGapMS.N)
	}
	if werr != nil || summary.OK != sessions || len(summary.Failures) != 0 {
		t.Fatalf("sessions lost with a relay pod deleted (%v): %d of %d ok, failures %v %v\n%s", werr, summary.OK, sessions, summary.Failures, summary.Errors, stderr.String())
	}
	if summary.MarkGapMS == nil || summary.MarkGapMS.N != sessions {
		t.Fatalf("no audio gap measured across the kill for every session: %+v", summary.MarkGapMS)
	}
}

// relayMetrics reads a relay's /metrics (the chart's metrics port) as
// name → value, summing the series of a name.
func relayMetrics(t *testing.T, hc *http.Client, podIP string) map[string]float64 {
	t.Helper()
	resp, err := hc.Get("http://" + podIP + ":9090/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			m[name] += v
		}
	}
	return m
}

// waitPodGone waits until pod name of ns no longer exists and returns
// when it saw that.
func waitPodGone(t *testing.T, cp *kube.ControlPlane, ns, name string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		list, err := cp.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err == nil && !slices.ContainsFunc(list.Items, func(p corev1.Pod) bool { return p.Name == name }) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still there after %v", name, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
