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
	"github.com/switchboard-rtc/switchboard/internal/testsupport/logbuf"
)

// TestNode runs the chart on a real node (internal/testsupport/kube,
// StartNode): kubelet, containerd and runc start the chart's relay,
// transceiver, agent and Redis pods from images built here, on a bridge
// pod network, behind kube-proxy; a client outside the cluster (its own
// network namespace, linked to the node) calls through the relay
// Service's load balancer IP, then a relay pod is deleted under load.
// It runs only with SWITCHBOARD_KUBE_NODE=1 (scripts/kube-node.sh) and
// never in CI: it needs root, containerd, the node binaries and
// minutes. StartNode fails it if the host's firewall gains a Kubernetes
// rule while it runs.
func TestNode(t *testing.T) {
	if os.Getenv(kube.NodeEnv) == "" {
		t.Skipf("a real node: set %s=1 (scripts/kube-node.sh installs, builds and runs it)", kube.NodeEnv)
	}
	if os.Getenv("CI") != "" {
		// It runs containerd, a kubelet and pods on the machine itself;
		// CI shares its machine with other tests.
		t.Skipf("a real node never runs in CI (CI is set), even with %s", kube.NodeEnv)
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
	const ns1 = "voice"
	h := kube.NewHelm(t, cp, chartDir, nodeRelease, ns1)
	installed := time.Now()
	h.Install(t, vals)
	ctx := t.Context()
	c := cp.Client
	relaySvc := nodeRelease + "-switchboard-relay"
	setLoadBalancerIP(t, cp, ns1, relaySvc, vip)
	pods := waitPodsReady(t, cp, ns1, 6, 4*time.Minute)
	ready := time.Now()
	t.Logf("helm install → %d pods Ready on the node in %v", len(pods), time.Since(installed).Round(time.Millisecond))
	for _, p := range pods {
		if p.Spec.NodeName != node.Name {
			t.Fatalf("pod %s on node %q, want %s", p.Name, p.Spec.NodeName, node.Name)
		}
		if !node.PodCIDR.Contains(netip.MustParseAddr(p.Status.PodIP)) {
			t.Fatalf("pod %s has IP %s, outside the pod network %s", p.Name, p.Status.PodIP, node.PodCIDR)
		}
	}
	sig, err := c.CoreV1().Services(ns1).Get(ctx, nodeRelease+"-switchboard-transceiver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s:%d/v1/calls", sig.Spec.ClusterIP, sig.Spec.Ports[0].Port)
	client, clientIP := node.Client(t)
	holdOnFailure(t, ns)
	t.Logf("client %s in namespace %s; signaling %s; relay VIP %s:3478", clientIP, client.Name, url, vip)

	// A call through the relay Service: signaling to the transceiver
	// Service's cluster IP, media to the VIP, both through kube-proxy.
	audio, err := filepath.Abs(filepath.Join("..", "testdata", "speech.wav"))
	if err != nil {
		t.Fatal(err)
	}
	call := func() (callReport, []byte, error) {
		out, err := client.Command(bin, "call", url, "-audio", audio, "-duration", "2s").Output()
		var r callReport
		if jerr := json.Unmarshal(out, &r); jerr != nil && err == nil {
			err = jerr
		}
		return r, out, err
	}
	// Pods Ready is not yet routable: kube-proxy programs a Service's
	// new endpoints a moment later (until then the transceiver's bridge
	// to the agent's Service is refused and the offer gets 502).
	var failed []string
	for {
		_, out, err := call()
		if err == nil {
			break
		}
		failed = append(failed, fmt.Sprintf("%v: %s", err, out))
		if time.Since(ready) > time.Minute {
			t.Fatalf("no call through the relay Service within a minute of the pods' readiness: %s\nrelays:\n%s\ntransceivers:\n%s\nagent:\n%s",
				strings.Join(failed, "\n"), podLogs(t, node, cp, ns1, "relay"), podLogs(t, node, cp, ns1, "transceiver"), podLogs(t, node, cp, ns1, "agent"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("first call through the VIP done %v after the pods were Ready (%d attempts failed before)", time.Since(ready).Round(time.Millisecond), len(failed))
	for i := range 3 {
		r, out, err := call()
		if err != nil {
			t.Fatalf("call %d through the relay Service: %v\n%s", i, err, out)
		}
		t.Logf("call %d: signaling %.1f ms, ICE %.1f ms, DTLS %.1f ms, first audio %.1f ms; %d/%d packets echoed",
			i, r.Setup.SignalingMS, r.Setup.ICEConnectedMS, r.Setup.DTLSConnectedMS, r.Setup.FirstAudioMS, r.PacketsReceived, r.PacketsSent)
	}

	// Calls through the VIP, and a relay pod failing under them: each
	// time with two relays Ready (the Deployment replaces a deleted one).
	for _, how := range []string{relayDeleted, relayForceDeleted, relayCrashed} {
		waitPodsReady(t, cp, ns1, 6, 2*time.Minute)
		killRelayUnderLoad(t, cp, node, client, bin, url, ns1, how)
	}
}

// holdOnFailure keeps a failed test's node running for
// SWITCHBOARD_KUBE_NODE_HOLD (a duration) before the cleanup, to look
// inside: ip netns exec <namespace> nft list ruleset, the kubelet's pod
// logs under the test's directory, ctr --address <socket> -n k8s.io.
func holdOnFailure(t *testing.T, ns *kube.NetNS) {
	hold, err := time.ParseDuration(os.Getenv("SWITCHBOARD_KUBE_NODE_HOLD"))
	if err != nil || hold <= 0 {
		return
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("holding the node (network namespace %s) for %v", ns.Name, hold)
			time.Sleep(hold)
		}
	})
}

// nodeRelease is TestNode's Helm release.
const nodeRelease = "sb"

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

// loadSummary is the JSON summary `switchboard load` prints last
// (callclient.LoadSummary).
type loadSummary struct {
	Sessions  int               `json:"sessions"`
	Connected int               `json:"connected"`
	OK        int               `json:"ok"`
	Failures  map[string]int    `json:"failures"`
	Errors    map[string]string `json:"errors"`
	Loss      float64           `json:"loss"`
	SetupMS   distribution      `json:"setup_ms"`
	MaxGapMS  distribution      `json:"max_gap_ms"`
	MarkGapMS *distribution     `json:"mark_gap_ms"`
}

type distribution struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// A relay fault under load: how a relay pod goes.
const (
	// relayDeleted: the pod deleted as `kubectl delete pod` does
	// (graceful: SIGTERM, the relay fails /ready and exits).
	relayDeleted = "deleted"
	// relayForceDeleted: `kubectl delete pod --grace-period=0 --force`:
	// the pod object goes at once, the kubelet kills the container.
	relayForceDeleted = "force-deleted"
	// relayCrashed: the relay process killed (SIGKILL) in its running
	// pod; the kubelet restarts the container at the same pod IP, which
	// stays an endpoint.
	relayCrashed = "crashed"
)

// killRelayUnderLoad runs sessions through the VIP, makes the relay
// pod that carries most of them fail the way how says, and checks that
// every session lives on, reporting the audio gap across the fault.
func killRelayUnderLoad(t *testing.T, cp *kube.ControlPlane, node *kube.Node, client *kube.NetNS, bin, url, ns, how string) {
	t.Helper()
	const sessions = 10
	relays, err := cp.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=relay"})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: node.DialContext}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	flowsBefore := map[string]float64{}
	for _, p := range relays.Items {
		flowsBefore[p.Name] = relayMetrics(t, hc, p.Status.PodIP)["switchboard_relay_flows"]
	}

	load := client.Command(bin, "load", url, "-sessions", strconv.Itoa(sessions), "-duration", "30s",
		"-ramp", "200ms", "-connected-json", "-sessions-json", "-progress", "0")
	stdout, err := load.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &logbuf.Buffer{}
	load.Stderr = stderr
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	// stdout: a {"event":"connected",…} line per session as it connects,
	// a line of each session's result as it ends, then the summary
	// (indented JSON).
	connectedCh := make(chan float64, sessions)
	summaryCh := make(chan []byte, 1)
	var markGaps []float64 // each session's largest gap after the fault, ms
	preMark := 0.0         // the largest gap of any session in the 5 s before it
	go func() {
		defer close(connectedCh)
		var rest []byte
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e struct {
				Event   string  `json:"event"`
				SetupMS float64 `json:"setup_ms"`
			}
			if strings.HasPrefix(sc.Text(), `{"event":`) && json.Unmarshal(sc.Bytes(), &e) == nil {
				if e.Event == "connected" {
					connectedCh <- e.SetupMS
				}
				continue
			}
			var r struct {
				MarkGapMS    *float64 `json:"mark_gap_ms"`
				PreMarkGapMS float64  `json:"pre_mark_gap_ms"`
			}
			if line := sc.Text(); strings.HasPrefix(line, `{"`) && strings.HasSuffix(line, "}") && json.Unmarshal(sc.Bytes(), &r) == nil && r.MarkGapMS != nil {
				markGaps = append(markGaps, *r.MarkGapMS)
				preMark = max(preMark, r.PreMarkGapMS)
				continue
			}
			rest = append(append(rest, sc.Bytes()...), '\n')
		}
		summaryCh <- rest
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
		case _, ok := <-connectedCh:
			if !ok {
				t.Fatalf("load ended with %d of %d sessions connected: %s\n%s", connected, sessions, <-summaryCh, stderr.String())
			}
			connected++
		case <-deadline:
			t.Fatalf("%d of %d sessions connected after 90 s:\n%s", connected, sessions, stderr.String())
		}
	}
	time.Sleep(3 * time.Second) // steady state: every session's flow on its relay

	// The sessions each relay carries: its new flows since the load began.
	carried := map[string]float64{}
	var victim, survivor *corev1.Pod
	for i := range relays.Items {
		p := &relays.Items[i]
		carried[p.Name] = relayMetrics(t, hc, p.Status.PodIP)["switchboard_relay_flows"] - flowsBefore[p.Name]
		if victim == nil || carried[p.Name] > carried[victim.Name] {
			victim, survivor = p, victim
		} else {
			survivor = p
		}
	}
	t.Logf("%s: sessions per relay (new flows): %v", how, carried)
	if carried[victim.Name] == 0 || survivor == nil {
		t.Fatalf("no relay carries a session of the %d: %v", sessions, carried)
	}
	before := relayMetrics(t, hc, survivor.Status.PodIP)

	// The fault: mark it in the load's figures, then cause it, and watch
	// the victim's endpoint in the relay Service's EndpointSlices.
	endpointGone := watchEndpointServing(t, cp, ns, nodeRelease+"-switchboard-relay", victim.Status.PodIP)
	fault := time.Now()
	if err := load.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	switch how {
	case relayDeleted, relayForceDeleted:
		opts := metav1.DeleteOptions{}
		if how == relayForceDeleted {
			zero := int64(0)
			opts.GracePeriodSeconds = &zero
		}
		if err := cp.Client.CoreV1().Pods(ns).Delete(t.Context(), victim.Name, opts); err != nil {
			t.Fatal(err)
		}
	case relayCrashed:
		if err := node.KillContainer(victim.Status.ContainerStatuses[0].ContainerID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: relay pod %s (%s) carrying %v sessions", how, victim.Name, victim.Status.PodIP, carried[victim.Name])

	out := <-summaryCh
	werr := load.Wait()
	var summary loadSummary
	if err := json.Unmarshal(out, &summary); err != nil {
		t.Fatalf("load's summary (%v): %v\n%s\n%s", werr, err, out, stderr.String())
	}
	if at, ok := endpointGone(); ok {
		t.Logf("%s: its endpoint stopped serving %v after the fault", how, at.Sub(fault).Round(time.Millisecond))
	} else {
		t.Logf("%s: its endpoint kept serving throughout", how)
	}
	after := relayMetrics(t, hc, survivor.Status.PodIP)
	delta := func(k string) float64 { return after[k] - before[k] }
	t.Logf("%s: the other relay %s: %v flows created, %v of them restored from the flow cache, %v relearned",
		how, survivor.Name, delta("switchboard_relay_flows_created_total"), delta("switchboard_relay_flows_restored_total"), delta("switchboard_relay_flows_relearned_total"))
	if how == relayCrashed {
		p, err := cp.Client.CoreV1().Pods(ns).Get(t.Context(), victim.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := relayMetrics(t, hc, p.Status.PodIP)
		t.Logf("%s: the restarted relay (restarts %d): %v flows created, %v of them restored from the flow cache, %v relearned",
			how, p.Status.ContainerStatuses[0].RestartCount, m["switchboard_relay_flows_created_total"], m["switchboard_relay_flows_restored_total"], m["switchboard_relay_flows_relearned_total"])
	}
	t.Logf("%s: load through the VIP: %d sessions, setup (POST → connected) p50 %.0f ms, p99 %.0f ms", how, summary.Sessions, summary.SetupMS.P50, summary.SetupMS.P99)
	if summary.MarkGapMS != nil {
		t.Logf("%s: %d of %d sessions ok, failures %v, loss %.4f; largest audio gap after the fault per session: p50 %.0f ms, p99 %.0f ms, max %.0f ms (n=%d)",
			how, summary.OK, summary.Sessions, summary.Failures, summary.Loss, summary.MarkGapMS.P50, summary.MarkGapMS.P99, summary.MarkGapMS.Max, summary.MarkGapMS.N)
	}
	// The sessions of the failed relay are the ones that paused: a gap
	// well above the 20 ms packet interval (and, on a loaded machine,
	// above the jitter the 5 s before the fault show).
	t.Logf("%s: largest gap of any session in the 5 s before the fault: %.0f ms", how, preMark)
	slices.Sort(markGaps)
	var hit []float64
	for _, g := range markGaps {
		if g > 250 {
			hit = append(hit, g)
		}
	}
	if len(hit) > 0 {
		others := "none"
		if n := len(markGaps) - len(hit); n > 0 {
			others = fmt.Sprintf("%d, largest gap %.0f ms", n, markGaps[n-1])
		}
		t.Logf("%s: %d sessions paused (gap > 250 ms) for %.0f to %.0f ms; others: %s", how, len(hit), hit[0], hit[len(hit)-1], others)
	}
	if werr != nil || summary.OK != sessions || len(summary.Failures) != 0 {
		t.Fatalf("%s: sessions lost (%v): %d of %d ok, failures %v %v\n%s", how, werr, summary.OK, sessions, summary.Failures, summary.Errors, stderr.String())
	}
	if summary.MarkGapMS == nil || summary.MarkGapMS.N != sessions {
		t.Fatalf("%s: no audio gap measured across the fault for every session: %+v", how, summary.MarkGapMS)
	}
}

// watchEndpointServing polls the EndpointSlices of service for ip's
// endpoint every 20 ms; the function it returns stops the watch and
// tells when ip stopped serving (gone, or serving false), if it did.
func watchEndpointServing(t *testing.T, cp *kube.ControlPlane, ns, service, ip string) func() (time.Time, bool) {
	t.Helper()
	stop, done := make(chan struct{}), make(chan struct{})
	var at time.Time
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			eps, err := cp.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + service})
			cancel()
			if err != nil {
				continue
			}
			serving := false
			for _, s := range eps.Items {
				for _, e := range s.Endpoints {
					if slices.Contains(e.Addresses, ip) && (e.Conditions.Serving == nil || *e.Conditions.Serving) {
						serving = true
					}
				}
			}
			if !serving {
				at = time.Now()
				return
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			close(stop)
			<-done
		}
	})
	return func() (time.Time, bool) {
		select {
		case <-done:
		default:
			close(stop)
			<-done
		}
		return at, !at.IsZero()
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
