//go:build linux

package kube

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The host's firewall must never see a node: the kubelet's KUBE-FIREWALL
// (which drops packets to 127.0.0.0/8 from anything but 127.0.0.0/8,
// such as a network namespace's veth) once reached the host's filter
// INPUT chain and broke every loopback test on the machine. StartNode
// snapshots the root network namespace's rules before it starts
// anything and compares them while the node runs and after it stops
// (kubeRules); whatever Kubernetes rule appeared there fails the test
// and is removed at once (removeKubeRules), since other tests share the
// host.

// rootNetNS is the host's network namespace: the test process's own
// (PID 1's may be unreadable even to root in a sandbox).
var rootNetNS = fmt.Sprintf("/proc/%d/ns/net", os.Getpid())

// kubeRules returns, per family ("ip", "ip6", "nft"), the lines of the
// ruleset of the network namespace at path nsPath (rootNetNS, or
// /run/netns/<name>) that belong to Kubernetes: iptables-save lines
// naming a KUBE- chain, nftables tables, chains and rules whose name or
// comment says kube. Each line is prefixed by its table's line and a
// tab. iptables-save (when installed) or nft failing is an error.
func kubeRules(nsPath string) (map[string][]string, error) {
	rules := map[string][]string{}
	for fam, cmd := range map[string][]string{
		"ip":  {"iptables-save"},
		"ip6": {"ip6tables-save"},
		"nft": {"nft", "-s", "list", "ruleset"}, // -s: no counters, which change
	} {
		out, err := inNetNS(nsPath, cmd...)
		if err != nil {
			if _, lerr := exec.LookPath(cmd[0]); lerr != nil && fam != "nft" {
				continue // no iptables: nothing can have added rules through it
			}
			return nil, err
		}
		var table string
		for line := range strings.SplitSeq(string(out), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(line, "*"):
				table = line // iptables-save: the table the lines below belong to
			case fam == "nft" && strings.HasPrefix(line, "table "):
				table = line
			}
			if strings.Contains(strings.ToLower(line), "kube") {
				rules[fam] = append(rules[fam], table+"\t"+line)
			}
		}
	}
	return rules, nil
}

// inNetNS runs a command in the network namespace at nsPath and returns
// its output.
func inNetNS(nsPath string, cmd ...string) ([]byte, error) {
	c := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--"}, cmd...)...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("%s in network namespace %s: %w: %s", strings.Join(cmd, " "), nsPath, err, stderr.Bytes())
	}
	return out, nil
}

// gainedHostRules returns the lines of now that before lacks.
func gainedHostRules(before, now map[string][]string) map[string][]string {
	gained := map[string][]string{}
	for fam, lines := range now {
		for _, l := range lines {
			if !slices.Contains(before[fam], l) {
				gained[fam] = append(gained[fam], l)
			}
		}
	}
	return gained
}

// describeHostRules formats gained rules for a test failure.
func describeHostRules(gained map[string][]string) string {
	var b strings.Builder
	for _, fam := range []string{"ip", "ip6", "nft"} {
		for _, l := range gained[fam] {
			table, rule, _ := strings.Cut(l, "\t")
			fmt.Fprintf(&b, "  %s %s: %s\n", fam, table, rule)
		}
	}
	return b.String()
}

// removeKubeRules deletes from the network namespace at nsPath the
// gained iptables rules (through iptables-restore --noflush: the rules as
// iptables-save printed them, with -D), then the KUBE- chains they
// created, and the nftables tables named kube that appeared.
func removeKubeRules(nsPath string, gained map[string][]string) error {
	var errs []string
	for fam, restore := range map[string]string{"ip": "iptables-restore", "ip6": "ip6tables-restore"} {
		type tableRules struct{ deletes, chains []string }
		tables := map[string]*tableRules{}
		var order []string
		for _, l := range gained[fam] {
			table, line, _ := strings.Cut(l, "\t")
			tr := tables[table]
			if tr == nil {
				tr = &tableRules{}
				tables[table] = tr
				order = append(order, table)
			}
			if rule, ok := strings.CutPrefix(line, "-A "); ok {
				tr.deletes = append(tr.deletes, "-D "+rule)
			} else if chain, ok := strings.CutPrefix(line, ":"); ok {
				tr.chains = append(tr.chains, strings.Fields(chain)[0])
			}
		}
		var in strings.Builder
		for _, table := range order {
			tr := tables[table]
			in.WriteString(table + "\n")
			for _, d := range tr.deletes {
				in.WriteString(d + "\n")
			}
			for _, c := range tr.chains {
				fmt.Fprintf(&in, "-F %s\n", c)
			}
			for _, c := range tr.chains {
				fmt.Fprintf(&in, "-X %s\n", c)
			}
			in.WriteString("COMMIT\n")
		}
		if in.Len() == 0 {
			continue
		}
		c := exec.Command("nsenter", "--net="+nsPath, "--", restore, "--noflush")
		c.Stdin = strings.NewReader(in.String())
		if out, err := c.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v: %s (input:\n%s)", restore, err, out, in.String()))
		}
	}
	for _, l := range gained["nft"] {
		_, line, _ := strings.Cut(l, "\t")
		f := strings.Fields(strings.TrimSuffix(line, "{"))
		if len(f) == 3 && f[0] == "table" {
			if _, err := inNetNS(nsPath, "nft", "delete", "table", f[1], f[2]); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if errs != nil {
		return fmt.Errorf("removing them: %s", strings.Join(errs, "; "))
	}
	return nil
}

// checkHostFirewall fails the test if the root network namespace gained
// Kubernetes rules since before, removing them; when names where.
func (n *Node) checkHostFirewall(when string) {
	n.t.Helper()
	now, err := kubeRules(rootNetNS)
	if err != nil {
		n.t.Errorf("checking the host's firewall %s: %v", when, err)
		return
	}
	gained := gainedHostRules(n.hostRules, now)
	if len(gained) == 0 {
		return
	}
	n.t.Errorf("the host's (root network namespace's) firewall gained Kubernetes rules %s: a node process ran outside the node's namespace:\n%s",
		when, describeHostRules(gained))
	if err := removeKubeRules(rootNetNS, gained); err != nil {
		n.t.Errorf("the host's firewall: %v", err)
	}
}

// checkInNetNS fails the test if a node process does not run in the
// node's network namespace.
func (n *Node) checkInNetNS() {
	n.t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+n.ns.Name, &want); err != nil {
		n.t.Fatalf("the node's network namespace: %v", err)
	}
	for name, p := range n.procs {
		pid := p.cmd.Process.Pid
		// nsenter joins the namespace and then execs the program: until
		// /proc/<pid>/exe is the program, the namespace may be the host's.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || filepath.Base(exe) != "nsenter" {
				break
			}
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
			select {
			case <-p.exited:
				continue // its own wait reports that
			default:
			}
			n.t.Fatalf("%s's network namespace: %v", name, err)
		}
		if st.Dev != want.Dev || st.Ino != want.Ino {
			n.t.Fatalf("%s (pid %d) runs outside the node's network namespace %s", name, pid, n.ns.Name)
		}
	}
}
