package kube

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Controllers are the kube-controller-manager controllers a control plane
// runs: those that act on the chart's objects (workloads and their pods,
// EndpointSlices of Services, ServiceAccounts, garbage collection of what
// an uninstall leaves, namespaces, PodDisruptionBudget status, HPAs). The node
// lifecycle controller is left out: there is no kubelet to renew a Node's
// lease, and it would evict every pod.
var Controllers = []string{
	"endpointslice-controller",
	"endpointslice-mirroring-controller",
	"statefulset-controller",
	"deployment-controller",
	"replicaset-controller",
	"daemonset-controller",
	"serviceaccount-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"disruption-controller",
	// Keeps an HPA's target at minReplicas even without a metrics API.
	"horizontal-pod-autoscaler-controller",
	"root-ca-certificate-publisher-controller",
}

// startTimeout bounds each component's start on a loaded two-core machine.
const startTimeout = 3 * time.Minute

// Options configure a control plane.
type Options struct {
	// NetNS, if set, runs every component inside that network namespace,
	// listening on its first address; the test reaches the API server
	// through NetNS.DialContext. Nil: the host's loopback.
	NetNS *NetNS
	// ServiceCIDR is the range of Service cluster IPs (virtual: nothing
	// routes them here unless a Node runs kube-proxy). Default
	// 10.96.0.0/24. The API server's certificate names its first address,
	// the "kubernetes" Service's cluster IP, as pods reach it.
	ServiceCIDR string
	// ServeKubernetesService has the API server publish its own address as
	// the endpoint of Service default/kubernetes (the lease endpoint
	// reconciler), so that pods on a Node (see StartNode) reach it at that
	// Service's cluster IP through kube-proxy, as in-cluster clients do.
	// It needs NetNS: a loopback address is no valid endpoint.
	ServeKubernetesService bool
	// MoreControllers are run besides Controllers, e.g. the node
	// lifecycle controller for a Node with a real kubelet.
	MoreControllers []string
}

// ControlPlane is a running etcd, kube-apiserver and
// kube-controller-manager. Start it with Start; it stops when the test
// ends.
type ControlPlane struct {
	// Host is the API server's URL, https://addr:port.
	Host string
	// Admin is a system:masters credential (client certificate).
	Admin *rest.Config
	// Client uses Admin.
	Client kubernetes.Interface
	// AdminKubeconfig is a kubeconfig file for Admin (no custom dialer:
	// for processes in the same network as the API server).
	AdminKubeconfig string
	// CA is the PEM of the CA that signed the API server's certificate.
	CA []byte

	t         testing.TB
	dir, bins string
	ns        *NetNS
	addr      string
	pki       *pki
	etcd, api *proc
	kcm       *proc
	apiArgs   []string
}

// Start builds nothing: it runs the binaries of BinDir (skipping the test
// if they are missing outside CI), waits until the API server is ready and
// the controller manager is acting, and registers their stop with
// t.Cleanup.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	bins := BinDir(t)
	cp := &ControlPlane{t: t, dir: t.TempDir(), bins: bins, ns: opts.NetNS}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "10.96.0.0/24"
	}
	var etcdPort, etcdPeer, apiPort int
	if cp.ns != nil {
		cp.addr = cp.ns.Addr(1).String()
		etcdPort, etcdPeer, apiPort = 2379, 2380, 6443 // a namespace of our own
	} else {
		cp.addr = "127.0.0.1"
		etcdPort, etcdPeer, apiPort = freeTCP(t), freeTCP(t), freeTCP(t)
	}
	_, svcNet, err := net.ParseCIDR(opts.ServiceCIDR)
	if err != nil {
		t.Fatalf("ServiceCIDR: %v", err)
	}
	firstSvc := slices.Clone(svcNet.IP.To4())
	if firstSvc == nil {
		t.Fatalf("ServiceCIDR %s: want IPv4", opts.ServiceCIDR)
	}
	firstSvc[3]++
	ips := []net.IP{net.ParseIP(cp.addr), net.ParseIP("127.0.0.1"), firstSvc}
	if opts.ServeKubernetesService && cp.ns == nil {
		t.Fatal("ServeKubernetesService needs NetNS: loopback is no valid endpoint address")
	}
	reconciler := "none"
	if opts.ServeKubernetesService {
		reconciler = "lease"
	}
	if cp.pki, err = newPKI(cp.dir, ips); err != nil {
		t.Fatal(err)
	}
	cp.CA = cp.pki.caPEM
	t.Cleanup(cp.stop)

	etcdURL := "http://" + net.JoinHostPort(cp.addr, strconv.Itoa(etcdPort))
	peerURL := "http://" + net.JoinHostPort(cp.addr, strconv.Itoa(etcdPeer))
	cp.etcd = cp.start("etcd",
		"--name=test", "--data-dir="+filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn")

	cp.Host = "https://" + net.JoinHostPort(cp.addr, strconv.Itoa(apiPort))
	cp.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + cp.addr, "--advertise-address=" + cp.addr,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + cp.pki.serverCert, "--tls-private-key-file=" + cp.pki.serverKey,
		"--client-ca-file=" + cp.pki.caFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + cp.pki.saKey,
		"--service-account-signing-key-file=" + cp.pki.saKey,
		"--service-cluster-ip-range=" + opts.ServiceCIDR,
		// "none": the "kubernetes" Service would get the API server's
		// address as its endpoint, and loopback is no valid endpoint
		// address (see ServeKubernetesService).
		"--endpoint-reconciler-type=" + reconciler,
		"--cert-dir=" + filepath.Join(cp.dir, "apiserver-certs"),
		"--profiling=false",
	}
	cp.api = cp.start("kube-apiserver", cp.apiArgs...)

	cp.Admin = &rest.Config{
		Host: cp.Host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: cp.pki.caPEM, CertData: cp.pki.adminCertPEM, KeyData: cp.pki.adminKeyPEM,
		},
		QPS: 100, Burst: 200,
	}
	if cp.ns != nil {
		cp.Admin.Dial = cp.ns.DialContext
	}
	cp.Client = kubernetes.NewForConfigOrDie(cp.Admin)
	cp.AdminKubeconfig = filepath.Join(cp.dir, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(cp.AdminKubeconfig, "admin", clientcmdapi.AuthInfo{
		ClientCertificateData: cp.pki.adminCertPEM, ClientKeyData: cp.pki.adminKeyPEM,
	}); err != nil {
		t.Fatal(err)
	}
	if err := cp.waitAPI(); err != nil {
		t.Fatal(err)
	}

	cp.kcm = cp.start("kube-controller-manager",
		"--kubeconfig="+cp.AdminKubeconfig,
		"--controllers="+strings.Join(append(slices.Clone(Controllers), opts.MoreControllers...), ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--root-ca-file="+cp.pki.caFile)
	// The ServiceAccount controller gives every namespace its "default"
	// ServiceAccount: once it exists, the controllers are running.
	if err := cp.waitFor(startTimeout, "kube-controller-manager to create ServiceAccount default/default", cp.kcm, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	return cp
}

// WriteKubeconfig writes a kubeconfig for the API server with user's
// credentials.
func (cp *ControlPlane) WriteKubeconfig(path, user string, auth clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos[user] = &auth
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

// RestartAPIServer stops the API server (SIGTERM, as a rolling upgrade
// does), waits down for down, starts it again on the same address and
// waits until it is ready. Watches through it break and must resume.
func (cp *ControlPlane) RestartAPIServer(down time.Duration) error {
	cp.api.stop()
	time.Sleep(down)
	cp.api = cp.start("kube-apiserver", cp.apiArgs...)
	return cp.waitAPI()
}

// Logs returns the tail of a component's log ("etcd", "kube-apiserver",
// "kube-controller-manager").
func (cp *ControlPlane) Logs(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(cp.dir, name+".log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (cp *ControlPlane) waitAPI() error {
	rc := rest.CopyConfig(cp.Admin)
	rc.Timeout = 5 * time.Second
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	return cp.waitFor(startTimeout, "kube-apiserver /readyz", cp.api, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.Host+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// waitFor polls cond until it holds, p exits, or timeout passes.
func (cp *ControlPlane) waitFor(timeout time.Duration, what string, p *proc, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("waiting for %s: %s exited: %v\n%s", what, p.name, p.cmd.ProcessState, cp.Logs(p.name, 40))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)\n%s", what, ctx.Err(), err, cp.Logs(p.name, 40))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// proc is one running component.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
}

func (cp *ControlPlane) start(name string, args ...string) *proc {
	cp.t.Helper()
	bin := filepath.Join(cp.bins, name)
	if cp.ns != nil {
		return cp.startCmd(name, cp.ns.Command(bin, args...))
	}
	return cp.startCmd(name, exec.Command(bin, args...))
}

// startCmd starts cmd as component name, its output in name.log.
func (cp *ControlPlane) startCmd(name string, cmd *exec.Cmd) *proc {
	cp.t.Helper()
	f, err := os.OpenFile(filepath.Join(cp.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		cp.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		cp.t.Fatalf("%s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	return p
}

// stop ends the process gracefully, or kills it after 10 s.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	_ = p.log.Close()
}

func (cp *ControlPlane) stop() {
	if cp.t.Failed() {
		for _, n := range []string{"kube-controller-manager", "kube-apiserver", "etcd"} {
			cp.t.Logf("%s log (tail):\n%s", n, cp.Logs(n, logTail))
		}
	}
	cp.kcm.stop()
	cp.api.stop()
	cp.etcd.stop()
}

// freeTCP returns a loopback TCP port that was free a moment ago.
func freeTCP(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// APIExtensions returns an admin client of the CustomResourceDefinition
// API.
func APIExtensions(t testing.TB, cp *ControlPlane) apiextensionsclient.Interface {
	t.Helper()
	c, err := apiextensionsclient.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitCRDs waits until the named CustomResourceDefinitions are
// established (their kinds are served).
func WaitCRDs(t testing.TB, c apiextensionsclient.Interface, names ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, name := range names {
		for {
			crd, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), name, metav1.GetOptions{})
			if err == nil && slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRD %s not established: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// logTail is how many lines of each component's log a failed test shows
// (env SWITCHBOARD_KUBE_LOG_LINES overrides it).
var logTail = func() int {
	if n, err := strconv.Atoi(os.Getenv("SWITCHBOARD_KUBE_LOG_LINES")); err == nil && n > 0 {
		return n
	}
	return 25
}()
