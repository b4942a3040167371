//go:build !linux

package kube

import (
	"context"
	"net"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// NodeBinaries are the programs a node needs besides the control
// plane's.
var NodeBinaries = []string{"kubelet", "kube-proxy", "kube-scheduler"}

// NodeEnv names the environment variable that runs the real-node test.
const NodeEnv = "SWITCHBOARD_KUBE_NODE"

// Node is a real node; it runs on Linux only.
type Node struct {
	Name    string
	IP      netip.Addr
	PodCIDR netip.Prefix
	DNS     netip.Addr
	Socket  string
}

// NodeOptions configure a node.
type NodeOptions struct {
	Name      string
	Verbosity int
}

// StartNode skips: a node needs Linux.
func StartNode(t testing.TB, cp *ControlPlane, opts NodeOptions) *Node {
	t.Skip("a real node needs Linux")
	return nil
}

// ImportImage does nothing outside Linux.
func (n *Node) ImportImage(string, []ImageFile, ImageConfig) {}

// Client skips: a node needs Linux.
func (n *Node) Client(t testing.TB) (*NetNS, netip.Addr) {
	t.Skip("a real node needs Linux")
	return nil, netip.Addr{}
}

// DialContext fails outside Linux.
func (n *Node) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, errNotLinux
}

// PodLog is empty outside Linux.
func (n *Node) PodLog(*corev1.Pod, int) string { return "" }

// KillContainer fails outside Linux.
func (n *Node) KillContainer(string) error { return errNotLinux }

// Logs is empty outside Linux.
func (n *Node) Logs(string, int) string { return "" }
