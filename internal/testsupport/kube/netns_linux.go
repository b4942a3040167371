//go:build linux

package kube

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace a test creates, with addresses of
// 10.78.0.0/24 on its loopback interface: pod IPs that the API server
// accepts in EndpointSlices (it rejects 127.0.0.0/8) and that no traffic
// leaves. Processes run inside it through Command ("ip netns exec", which
// also bind-mounts /etc/netns/<name>/hosts over /etc/hosts, see
// WriteHosts); the test process reaches them through DialContext and
// ListenPacket. It needs root and iproute2: without them the test skips,
// except in CI, where it fails.
type NetNS struct {
	Name string

	t     testing.TB
	mu    sync.Mutex
	added map[netip.Addr]bool
}

// NewNetNS creates a namespace with its loopback up and deletes it (and
// what runs in it) when the test ends.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	n := newNetNS(t)
	n.AddAddr(n.Addr(1))
	return n
}

// newNetNS creates a namespace with its loopback up and no address of
// 10.78.0.0/24.
func newNetNS(t testing.TB) *NetNS {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root for network namespaces"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "needs ip from iproute2"
	}
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	n := &NetNS{Name: fmt.Sprintf("sbkube-%d-%d", os.Getpid(), nsSeq.Add(1)), t: t, added: map[netip.Addr]bool{}}
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(n.remove)
	n.ip("link", "set", "lo", "up")
	return n
}

var nsSeq atomic.Int64

// Addr returns 10.78.0.i (i from 1 to 254). Addr(1) is the control
// plane's.
func (n *NetNS) Addr(i int) netip.Addr {
	if i < 1 || i > 254 {
		panic(fmt.Sprintf("kube: NetNS.Addr(%d): want 1 to 254", i))
	}
	return netip.AddrFrom4([4]byte{10, 78, 0, byte(i)})
}

// AddAddr puts a on the namespace's loopback interface, so that a process
// inside can bind it.
func (n *NetNS) AddAddr(a netip.Addr) {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.added[a] {
		return
	}
	n.ip("addr", "add", a.String()+"/32", "dev", "lo")
	n.added[a] = true
}

func (n *NetNS) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip -n %s %s: %v: %s", n.Name, strings.Join(args, " "), err, out)
	}
}

// Command runs bin inside the namespace. "ip netns exec" execs bin in
// place, so signals to the command reach it.
func (n *NetNS) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
}

// Enter runs bin in the namespace's network only (nsenter --net), not in
// the mount namespace of its own that "ip netns exec" makes: for a node's
// containerd and kubelet, which must see each other's mounts. nsenter
// execs bin in place.
func (n *NetNS) Enter(bin string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + filepath.Join("/run/netns", n.Name), "--", bin}, args...)...)
}

// WriteHosts makes hosts (name → address) the /etc/hosts of processes
// started inside the namespace from now on, the way cluster DNS answers
// for pods: a test writes there the names the chart gives pods.
func (n *NetNS) WriteHosts(hosts map[string]netip.Addr) error {
	dir := filepath.Join("/etc/netns", n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n")
	for name, a := range hosts {
		fmt.Fprintf(&b, "%s %s\n", a, name)
	}
	return os.WriteFile(filepath.Join(dir, "hosts"), []byte(b.String()), 0o644)
}

// DialContext dials addr from inside the namespace: the socket is
// created on a thread switched into the namespace (a socket keeps the
// namespace it was created in), then the thread switches back.
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// ListenPacket opens a packet socket inside the namespace.
func (n *NetNS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// do runs f on an OS thread inside the namespace. If the thread cannot
// switch back, it stays locked, and the runtime ends it with the
// goroutine.
func (n *NetNS) do(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open(filepath.Join("/run/netns", n.Name))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", n.Name, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns back: %w", err) // the thread stays locked and dies
	}
	runtime.UnlockOSThread()
	return ferr
}

// remove kills what still runs inside and deletes the namespace.
func (n *NetNS) remove() {
	if out, _ := exec.Command("ip", "netns", "pids", n.Name).Output(); len(out) > 0 {
		for _, pid := range strings.Fields(string(out)) {
			_ = exec.Command("kill", "-9", pid).Run()
		}
	}
	if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		n.t.Errorf("ip netns del %s: %v: %s", n.Name, err, out)
	}
	_ = os.RemoveAll(filepath.Join("/etc/netns", n.Name))
}
