//go:build linux

package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/sys/unix"
)

// A real node: Debian's containerd and runc, the CNI bridge plugin, and
// kubelet, kube-proxy and kube-scheduler of the pinned Kubernetes
// release, all running in the control plane's network namespace, so
// that the pod network (bridge sbk0, 10.79.0.0/24), kube-proxy's
// nftables rules and the cluster DNS live and die with that namespace
// and never touch the host's. containerd keeps its state, runc's and
// the pods' network namespace files under the test's directory. See
// StartNode.

// NodeBinaries are the programs a node needs besides the control
// plane's; `scripts/kube-build.sh --node` builds them.
var NodeBinaries = []string{"kubelet", "kube-proxy", "kube-scheduler"}

// NodeEnv names the environment variable that runs the real-node test
// (deploy TestNode): it needs root, containerd, runc, the CNI plugins,
// dnsmasq and the NodeBinaries (scripts/kube-node.sh installs and builds
// them), and it is not part of the default test command.
const NodeEnv = "SWITCHBOARD_KUBE_NODE"

// kernelTunables are the sysctls the kubelet insists on (it sets them
// unless protectKernelDefaults, which the node uses so that it changes
// nothing on the host; scripts/kube-node.sh sets them).
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// Node is a running node registered with a control plane.
type Node struct {
	// Name is the Node's name.
	Name string
	// IP is its InternalIP: the control plane's address, 10.78.0.1.
	IP netip.Addr
	// PodCIDR is the pod network; its first address is the bridge's.
	PodCIDR netip.Prefix
	// DNS is the cluster DNS server's address (dnsmasq, answering
	// <service>.<namespace>.svc.cluster.local with the Service's cluster
	// IP, from the API server's Services).
	DNS netip.Addr
	// Socket is containerd's socket, for ctr.
	Socket string

	t        testing.TB
	cp       *ControlPlane
	ns       *NetNS
	dir      string
	procs    map[string]*proc
	clients  int
	stopSync chan struct{}
	syncDone chan struct{}
	// varLibKubelet: whether /var/lib/kubelet existed before the kubelet
	// ran (its device plugin socket's place is fixed there); likewise
	// /var/log/containers, where it links the containers' logs.
	varLibKubelet, varLogContainers bool
	// hostRules: the Kubernetes rules of the root network namespace's
	// firewall before the node started (kubeRules), normally none.
	hostRules map[string][]string
}

// NodeOptions configure a node.
type NodeOptions struct {
	// Name of the Node; default node-1.
	Name string
	// Verbosity of kubelet's and kube-proxy's logs (-v); default 1.
	Verbosity int
}

// StartNode starts containerd, the cluster DNS, kubelet, kube-proxy
// (nftables mode) and kube-scheduler for cp, which must run in a NetNS
// with ServeKubernetesService (pods reach the API server at the
// "kubernetes" Service's cluster IP) and the node lifecycle controller
// among MoreControllers; it waits until the Node is Ready and kube-proxy
// has synced, and registers their stop, with every pod, container, mount
// and cgroup they made, with t.Cleanup. A missing prerequisite fails the
// test, naming what to install (scripts/kube-node.sh).
func StartNode(t testing.TB, cp *ControlPlane, opts NodeOptions) *Node {
	t.Helper()
	if cp.ns == nil {
		t.Fatal("StartNode: the control plane must run in a NetNS (Options.NetNS)")
	}
	if opts.Name == "" {
		opts.Name = "node-1"
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 1
	}
	if err := nodePrereqs(cp.bins); err != nil {
		t.Fatalf("a real node: %v (scripts/kube-node.sh installs and builds what it needs)", err)
	}
	n := &Node{
		Name: opts.Name, IP: cp.ns.Addr(1),
		PodCIDR: netip.MustParsePrefix("10.79.0.0/24"),
		DNS:     cp.ns.Addr(10),
		t:       t, cp: cp, ns: cp.ns, dir: t.TempDir(), procs: map[string]*proc{},
	}
	n.Socket = filepath.Join(n.dir, "containerd.sock")
	_, err := os.Stat(devicePluginDir)
	n.varLibKubelet = err == nil
	_, err = os.Stat(containerLogLinks)
	n.varLogContainers = err == nil
	if n.hostRules, err = kubeRules(rootNetNS); err != nil {
		t.Fatalf("a real node: snapshotting the host's firewall: %v", err)
	}
	t.Cleanup(n.stop)

	// The namespace routes between pods, the clients' links and itself.
	for _, sc := range []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"} {
		if out, err := exec.Command("ip", "netns", "exec", n.ns.Name, "sysctl", "-qw", sc).CombinedOutput(); err != nil {
			t.Fatalf("sysctl %s in %s: %v: %s", sc, n.ns.Name, err, out)
		}
	}
	n.startContainerd()
	n.startDNS()
	pf, pc := PauseImage(t)
	n.ImportImage(pauseImage, pf, pc)
	n.startKubelet(opts.Verbosity)
	n.startProxy(opts.Verbosity)
	n.start("kube-scheduler", filepath.Join(cp.bins, "kube-scheduler"),
		"--kubeconfig="+cp.AdminKubeconfig, "--leader-elect=false", "--secure-port=0")
	n.checkInNetNS()
	n.checkHostFirewall("while the node runs")
	return n
}

// pauseImage is the pods' sandbox image (PauseImage).
const pauseImage = "localhost/switchboard-test/pause:1"

func nodePrereqs(bins string) error {
	var missing []string
	for _, b := range NodeBinaries {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			missing = append(missing, b+" (scripts/kube-build.sh --node)")
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "dnsmasq", "nft", "ldd"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			missing = append(missing, "/usr/lib/cni/"+p+" (containernetworking-plugins)")
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	var wrong []string
	for k, want := range kernelTunables {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil || strings.TrimSpace(string(b)) != want {
			wrong = append(wrong, fmt.Sprintf("%s=%s (is %s)", strings.ReplaceAll(k, "/", "."), want, strings.TrimSpace(string(b))))
		}
	}
	var errs []error
	if missing != nil {
		errs = append(errs, fmt.Errorf("missing: %s", strings.Join(missing, ", ")))
	}
	if wrong != nil {
		slices.Sort(wrong)
		errs = append(errs, fmt.Errorf("the kubelet needs the kernel tunables %s", strings.Join(wrong, ", ")))
	}
	return errors.Join(errs...)
}

// start runs bin inside the node's network namespace (not its own mount
// namespace: containerd and the kubelet share the host's mounts), its
// output in the control plane's directory as name.log.
func (n *Node) start(name, bin string, args ...string) *proc {
	n.t.Helper()
	p := n.cp.startCmd(name, n.ns.Enter(bin, args...))
	n.procs[name] = p
	return p
}

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.dir}, elem...)...) }

func (n *Node) write(name, content string) string {
	n.t.Helper()
	p := n.path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	return p
}

// startContainerd runs containerd with everything under the node's
// directory: its root and state, runc's state, the pods' network
// namespace files, the CNI configuration and IP allocations.
func (n *Node) startContainerd() {
	n.t.Helper()
	gw := n.PodCIDR.Addr().Next()
	n.write("cni/10-pods.conflist", fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "switchboard-test-pods",
  "plugins": [{
    "type": "bridge", "bridge": "sbk0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q,
             "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, n.path("cni-ipam"), n.PodCIDR.String(), gw.String()))
	cfg := n.write("containerd.toml", fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %q
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The sandbox refuses a lower oom_score_adj than the caller's, even to
  # root; runc fails the pod sandbox's -998 without this.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
    max_conf_num = 1
`, n.path("containerd", "root"), n.path("containerd", "state"), n.Socket,
		n.path("containerd", "opt"), pauseImage, n.path("containerd", "runc"), n.path("cni")))
	p := n.start("containerd", "containerd", "--config", cfg)
	if err := n.cp.waitFor(time.Minute, "containerd", p, func(ctx context.Context) (bool, error) {
		_, err := n.ctr(ctx, "version")
		return err == nil, err
	}); err != nil {
		n.t.Fatal(err)
	}
}

// ctr runs ctr against the node's containerd in the k8s.io namespace
// (the CRI's).
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// ImportImage makes an image of files named ref available on the node
// (ctr images import of WriteImage's archive), as if pulled: pods use it
// with imagePullPolicy Never or IfNotPresent.
func (n *Node) ImportImage(ref string, files []ImageFile, cfg ImageConfig) {
	n.t.Helper()
	f, err := os.CreateTemp(n.dir, "image-*.tar")
	if err != nil {
		n.t.Fatal(err)
	}
	defer os.Remove(f.Name())
	w := bufio.NewWriter(f)
	if err := WriteImage(w, ref, files, cfg); err != nil {
		n.t.Fatal(err)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := n.ctr(ctx, "images", "import", "--snapshotter", "overlayfs", f.Name()); err != nil {
		n.t.Fatal(err)
	}
	out, err := n.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		n.t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(out)), ref) {
		n.t.Fatalf("ctr images import: %s not among the images:\n%s", ref, out)
	}
}

// startDNS runs dnsmasq at DNS, answering for the Services of the API
// server, and keeps its records current (a Service's cluster IP is set
// when it is created and never changes; new Services appear within
// 250 ms).
func (n *Node) startDNS() {
	n.t.Helper()
	n.ns.AddAddr(n.DNS)
	hosts := n.path("dns", "hosts")
	records := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		svcs, err := n.cp.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, s := range svcs.Items {
			if ip := s.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
				fmt.Fprintf(&b, "%s %s.%s.svc.cluster.local\n", ip, s.Name, s.Namespace)
			}
		}
		return b.String(), nil
	}
	last, err := records()
	if err != nil {
		n.t.Fatal(err)
	}
	n.write("dns/hosts", last)
	p := n.start("dnsmasq", "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
		"--no-resolv", "--no-hosts", "--no-negcache", "--addn-hosts="+hosts,
		"--listen-address="+n.DNS.String(), "--bind-interfaces",
		"--local=/cluster.local/", "--domain-needed", "--user=root", "--group=root",
		"--pid-file="+n.path("dns", "dnsmasq.pid"), "--log-facility=-")
	// Until dnsmasq has set up its handlers, SIGHUP would end it: wait
	// for its first answer before the updates below signal it.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return n.ns.DialContext(ctx, network, netip.AddrPortFrom(n.DNS, 53).String())
	}}
	if err := n.cp.waitFor(time.Minute, "dnsmasq", p, func(ctx context.Context) (bool, error) {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := r.LookupHost(qctx, "kubernetes.default.svc.cluster.local")
		var dnsErr *net.DNSError
		return err == nil || errors.As(err, &dnsErr) && dnsErr.IsNotFound, err // an answer, yes or no
	}); err != nil {
		n.t.Fatal(err)
	}
	n.stopSync, n.syncDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(n.syncDone)
		for {
			select {
			case <-n.stopSync:
				return
			case <-time.After(250 * time.Millisecond):
			}
			rec, err := records()
			if err != nil || rec == last {
				continue
			}
			last = rec
			if os.WriteFile(hosts, []byte(rec), 0o644) == nil {
				_ = p.cmd.Process.Signal(syscall.SIGHUP) // dnsmasq reads its hosts files again
			}
		}
	}()
}

// startKubelet runs the kubelet and waits until its Node is Ready.
func (n *Node) startKubelet(v int) {
	n.t.Helper()
	resolv := n.write("kubelet/resolv.conf", "# no host DNS: pods use the cluster's\n")
	cfg := n.write("kubelet/config.yaml", fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
# This kernel mounts the cgroup v1 controllers (and an empty v2
# hierarchy); kubelet v1.37 refuses v1 unless told.
failCgroupV1: false
# The sandbox already puts this process in a memory cgroup of its own:
# no QoS or node-allocatable cgroups above the pods'.
cgroupsPerQOS: false
enforceNodeAllocatable: []
# Check, do not set, the host's kernel tunables.
protectKernelDefaults: true
# No KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY or KUBE-FIREWALL chains:
# kube-proxy runs in nftables mode and needs none of them, and the
# kubelet re-creates them every minute in whatever namespace it runs in.
makeIPTablesUtilChains: false
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: %s
podLogsDir: %s
failSwapOn: false
# Never collect the imported images (there is no registry to pull them
# again), and evict nothing on a shared machine.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
`, n.IP, n.Socket, n.DNS, resolv, n.path("pod-logs")))
	p := n.start("kubelet", filepath.Join(n.cp.bins, "kubelet"),
		"--config="+cfg, "--kubeconfig="+n.cp.AdminKubeconfig,
		"--root-dir="+n.path("kubelet", "root"), "--cert-dir="+n.path("kubelet", "pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP.String(), "--v="+strconv.Itoa(v))
	if err := n.cp.waitFor(startTimeout, "node "+n.Name+" Ready", p, func(ctx context.Context) (bool, error) {
		node, err := n.cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("condition Ready is %s: %s", c.Status, c.Message)
			}
		}
		return false, nil
	}); err != nil {
		n.t.Fatal(err)
	}
}

// startProxy runs kube-proxy in nftables mode (its own table in the
// node's namespace; conntrack sysctls, which are the host's, left alone)
// and waits until it has synced its rules.
func (n *Node) startProxy(v int) {
	n.t.Helper()
	cfg := n.write("kube-proxy.yaml", fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %s
clusterCIDR: %s
clientConnection:
  kubeconfig: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.Name, n.PodCIDR, n.cp.AdminKubeconfig))
	p := n.start("kube-proxy", filepath.Join(n.cp.bins, "kube-proxy"), "--config="+cfg, "--v="+strconv.Itoa(v))
	hc := &http.Client{Transport: &http.Transport{DialContext: n.ns.DialContext}, Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	if err := n.cp.waitFor(startTimeout, "kube-proxy /healthz", p, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:10256/healthz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("healthz %s", resp.Status)
	}); err != nil {
		n.t.Fatal(err)
	}
}

// Client creates a network namespace linked to the node's by a veth
// pair (10.77.i.2 on the client's side, 10.77.i.1 on the node's), with
// its default route through the node: a client outside the cluster
// whose packets to Services' cluster and load balancer IPs meet
// kube-proxy's rules as they enter the node. It is deleted when the test
// ends.
func (n *Node) Client(t testing.TB) (*NetNS, netip.Addr) {
	t.Helper()
	n.clients++
	i := n.clients
	c := newNetNS(t)
	link := fmt.Sprintf("sbkc%d", i)
	nodeSide, clientSide := netip.AddrFrom4([4]byte{10, 77, byte(i), 1}), netip.AddrFrom4([4]byte{10, 77, byte(i), 2})
	n.ns.ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", c.Name)
	n.ns.ip("addr", "add", nodeSide.String()+"/24", "dev", link)
	n.ns.ip("link", "set", link, "up")
	c.ip("addr", "add", clientSide.String()+"/24", "dev", "eth0")
	c.ip("link", "set", "eth0", "up")
	c.ip("route", "add", "default", "via", nodeSide.String())
	return c, clientSide
}

// DialContext dials from the node's network namespace: pod IPs, Service
// IPs through kube-proxy, the node's own ports.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.ns.DialContext(ctx, network, addr)
}

// PodLog returns the last lines of the logs the kubelet kept of pod's
// containers (every container and restart, in name order).
func (n *Node) PodLog(pod *corev1.Pod, lines int) string {
	files, _ := filepath.Glob(n.path("pod-logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), "*", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		ls := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(ls) > lines {
			ls = ls[len(ls)-lines:]
		}
		fmt.Fprintf(&b, "%s:\n%s\n", strings.TrimPrefix(f, n.path("pod-logs")+"/"), strings.Join(ls, "\n"))
	}
	return b.String()
}

// KillContainer kills a container's processes with SIGKILL (its
// status's containerID, containerd://<id>), as a crash would: the
// kubelet sees it exit and restarts it by the pod's restartPolicy.
func (n *Node) KillContainer(containerID string) error {
	id, ok := strings.CutPrefix(containerID, "containerd://")
	if !ok {
		return fmt.Errorf("container %q: not a containerd:// id", containerID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := n.ctr(ctx, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
	return err
}

// Logs returns the tail of a node component's log ("containerd",
// "kubelet", "kube-proxy", "kube-scheduler", "dnsmasq").
func (n *Node) Logs(name string, lines int) string { return n.cp.Logs(name, lines) }

// stop deletes every pod through the kubelet, stops the node's
// processes, and removes what containerd, runc and the kubelet left:
// containers and their shims, mounts under the node's directory,
// cgroups of its containers, the kubelet's log links, libcni's cache
// of their networks. The bridge,
// veths and kube-proxy's rules go with the network namespace.
func (n *Node) stop() {
	t := n.t
	if t.Failed() {
		for _, name := range []string{"containerd", "kubelet", "kube-proxy", "kube-scheduler", "dnsmasq"} {
			if n.procs[name] != nil {
				t.Logf("%s log (tail):\n%s", name, n.Logs(name, logTail))
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n.procs["kube-scheduler"].stop()
	if n.procs["kubelet"] != nil {
		n.deletePods(ctx)
	}
	for _, name := range []string{"kube-proxy", "kubelet"} {
		n.procs[name].stop()
	}
	var ids []string
	if n.procs["containerd"] != nil {
		ids = n.removeContainers(ctx)
		n.procs["containerd"].stop()
	}
	n.killShims()
	if n.stopSync != nil {
		close(n.stopSync)
		<-n.syncDone
	}
	n.procs["dnsmasq"].stop()
	if err := unmountUnder(n.dir); err != nil {
		t.Errorf("node cleanup: %v", err)
	}
	removeLogLinks(containerLogLinks, n.dir)
	if !n.varLogContainers {
		_ = os.Remove(containerLogLinks) // only if empty: another node's links stay
	}
	removeCgroups(ids)
	removeCNICache(ids)
	// The kubelet's device plugin socket is not under its root directory.
	_ = os.Remove(filepath.Join(devicePluginDir, "kubelet.sock"))
	if !n.varLibKubelet {
		_ = os.Remove(devicePluginDir)
		_ = os.Remove(filepath.Dir(devicePluginDir))
	}
	if n.hostRules != nil {
		n.checkHostFirewall("after the node stopped")
	}
}

// containerLogLinks is where the kubelet links each container's log,
// whatever its podLogsDir.
const containerLogLinks = "/var/log/containers"

// devicePluginDir is where every kubelet listens for device plugins,
// whatever its --root-dir: two nodes on one machine share it.
const devicePluginDir = "/var/lib/kubelet/device-plugins"

// deletePods deletes the pods bound to the node (grace period 1 s) and
// waits until the kubelet has removed them and stopped their containers.
// The scheduler is stopped first: the controllers' replacements stay
// pending.
func (n *Node) deletePods(ctx context.Context) {
	one := int64(1)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		pods, err := n.cp.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			n.t.Logf("node cleanup: list pods: %v", err)
			return
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				_ = n.cp.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &one})
			}
		}
		out, err := n.ctr(ctx, "tasks", "ls", "-q")
		if err == nil && len(pods.Items) == 0 && len(bytes.TrimSpace(out)) == 0 {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	n.t.Logf("node cleanup: pods still running after a minute; killing their containers")
}

// removeContainers kills and deletes what containers containerd still
// has (pods the kubelet did not finish with) and returns the ids of all
// containers it had.
func (n *Node) removeContainers(ctx context.Context) []string {
	out, err := n.ctr(ctx, "containers", "ls", "-q")
	if err != nil {
		n.t.Logf("node cleanup: %v", err)
		return nil
	}
	ids := strings.Fields(string(out))
	for _, id := range ids {
		_, _ = n.ctr(ctx, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
		_, _ = n.ctr(ctx, "tasks", "delete", "--force", id)
		if _, err := n.ctr(ctx, "containers", "delete", id); err != nil {
			n.t.Logf("node cleanup: %v", err)
		}
	}
	return ids
}

// killShims kills containerd-shim processes of this node's containerd
// (matched by its socket in their command line) that outlived it.
func (n *Node) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) || !bytes.Contains(b, []byte(n.Socket)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeLogLinks removes the symbolic links in dir that point below
// target (the kubelet links each container's log in /var/log/containers).
func removeLogLinks(dir, target string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if dest, err := os.Readlink(p); err == nil && strings.HasPrefix(dest, target+"/") {
			_ = os.Remove(p)
		}
	}
}

// removeCNICache removes the results libcni caches in
// /var/lib/cni/results for the containers' networks (for a sandbox the
// kubelet did not tear down; one it did has none left).
func removeCNICache(ids []string) {
	for _, id := range ids {
		files, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*-"+id+"-*"))
		for _, f := range files {
			_ = os.Remove(f)
		}
	}
}

// removeCgroups removes the cgroup v1 directories named after the
// containers (runc's cgroupfs paths, /k8s.io/<id> under each controller)
// that runc left.
func removeCgroups(ids []string) {
	if len(ids) == 0 {
		return
	}
	controllers, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, c := range controllers {
		for _, id := range ids {
			_ = os.Remove(filepath.Join(c, "k8s.io", id))
		}
	}
}
