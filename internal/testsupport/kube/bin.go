package kube

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// BinEnv names the environment variable that gives the directory of the
// control plane binaries (etcd, kube-apiserver, kube-controller-manager).
// scripts/test.sh sets it to what scripts/kube-build.sh printed.
const BinEnv = "SWITCHBOARD_KUBE_BIN"

// Binaries lists the programs a control plane needs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

var bins struct {
	once sync.Once
	dir  string
	err  error
}

// BinDir returns the directory of the control plane binaries: $BinEnv if
// set, else the cache of scripts/kube-build.sh when it holds a build of
// the pinned versions. It does not build them (a cold build takes minutes;
// scripts/test.sh and scripts/kube-build.sh do it): without them a test
// skips, except in CI (env CI set), where it fails.
func BinDir(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	bins.once.Do(func() { bins.dir, bins.err = findBins() })
	if bins.err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Kubernetes control plane binaries: %v", bins.err)
		}
		t.Skipf("Kubernetes control plane binaries: %v (scripts/kube-build.sh builds them)", bins.err)
	}
	return bins.dir
}

func findBins() (string, error) {
	dir := os.Getenv(BinEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		out, err := exec.Command(filepath.Join(root, "scripts", "kube-build.sh"), "-n").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("not built yet: %s", strings.TrimSpace(string(ee.Stderr)))
			}
			return "", err
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s: %w", BinEnv, err)
		}
	}
	return dir, nil
}

// repoRoot walks up from the working directory to the module root.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "kube-build.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("scripts/kube-build.sh not found above the working directory")
		}
		dir = parent
	}
}
