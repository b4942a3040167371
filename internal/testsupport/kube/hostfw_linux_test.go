//go:build linux

package kube

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestKubeRulesRemoved adds, in a network namespace of its own, the
// chains and rules a kubelet adds (iptables and ip6tables) and a
// kube-proxy nftables table, beside a rule of someone else's, and checks
// that StartNode's host guard finds every one of them and removes them
// and nothing else.
func TestKubeRulesRemoved(t *testing.T) {
	for _, tool := range []string{"iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("needs %s", tool)
			}
			t.Skipf("needs %s", tool)
		}
	}
	ns := newNetNS(t)
	path := "/run/netns/" + ns.Name
	run := func(stdin string, cmd ...string) {
		t.Helper()
		c := exec.Command("nsenter", append([]string{"--net=" + path, "--"}, cmd...)...)
		c.Stdin = strings.NewReader(stdin)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
	// Someone else's rule, which must stay.
	run("*filter\n-A INPUT -p udp --dport 9 -j DROP\nCOMMIT\n", "iptables-restore", "--noflush")
	before, err := kubeRules(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 0 {
		t.Fatalf("a new namespace has Kubernetes rules: %v", before)
	}

	run(`*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*nat
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-I INPUT -j KUBE-FIREWALL
-I OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
`, "iptables-restore", "--noflush")
	run("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n", "ip6tables-restore", "--noflush")
	run("add table ip kube-proxy\nadd chain ip kube-proxy services\n", "nft", "-f", "-")

	after, err := kubeRules(path)
	if err != nil {
		t.Fatal(err)
	}
	gained := gainedHostRules(before, after)
	desc := describeHostRules(gained)
	for _, want := range []string{
		"ip *filter: -A INPUT -j KUBE-FIREWALL",
		"ip *filter: -A OUTPUT -j KUBE-FIREWALL",
		"ip *filter: -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8",
		"ip *mangle: :KUBE-IPTABLES-HINT",
		"ip *nat: :KUBE-KUBELET-CANARY",
		"ip6 *mangle: :KUBE-IPTABLES-HINT",
		"nft table ip kube-proxy {: table ip kube-proxy {",
	} {
		if !strings.Contains(desc, want) {
			t.Errorf("the guard missed %q; it found:\n%s", want, desc)
		}
	}
	if err := removeKubeRules(path, gained); err != nil {
		t.Fatal(err)
	}
	left, err := kubeRules(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("left after removal:\n%s", describeHostRules(left))
	}
	out, err := inNetNS(path, "iptables-save", "-t", "filter")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "-A INPUT -p udp -m udp --dport 9 -j DROP") {
		t.Errorf("the removal took someone else's rule too:\n%s", out)
	}
}
