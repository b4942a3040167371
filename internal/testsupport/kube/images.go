package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The images a Node runs, built here from what the machine has (no
// registry is reachable): the repository's own image as the Dockerfile
// makes it, Debian's redis-server, and a pod sandbox's pause process.

// SwitchboardImage builds the switchboard binary the way the Dockerfile
// does (cgo, linked statically against Debian's libopus, libspeexdsp and
// libwebrtc-audio-processing, with the Dockerfile's build tags) and
// returns its path on the host and the files and config of the image's
// final stage: /usr/local/bin/switchboard, the speech file of the smoke
// test at /usr/share/switchboard/speech.wav, an /etc/passwd with
// "nonroot" (65532) as distroless has, user 65532:65532, entrypoint
// switchboard.
func SwitchboardImage(t testing.TB) (bin string, files []ImageFile, cfg ImageConfig) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	tags := regexp.MustCompile(`-tags '([^']+)'`).FindSubmatch(df)
	ext := regexp.MustCompile(`-extldflags '([^']+)'`).FindSubmatch(df)
	if tags == nil || ext == nil {
		t.Fatal("Dockerfile: no -tags '…' or -extldflags '…' in its go build")
	}
	bin = filepath.Join(t.TempDir(), "switchboard")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-tags", string(tags[1]),
		"-ldflags", "-s -w -X main.version=node-test -linkmode external -extldflags '"+string(ext[1])+"'",
		"-o", bin, "./cmd/switchboard")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("static build of switchboard (as the Dockerfile's): %v\n%s", err, out)
	}
	if out, err := exec.Command("ldd", bin).CombinedOutput(); err == nil {
		t.Fatalf("%s is not static: ldd says\n%s", bin, out)
	}
	files = []ImageFile{
		{Path: "/usr/local/bin/switchboard", From: bin, Mode: 0o755},
		{Path: "/usr/share/switchboard/speech.wav", From: filepath.Join(root, "testdata", "speech.wav")},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
	}
	return bin, files, ImageConfig{
		Entrypoint: []string{"switchboard"}, Cmd: []string{"-h"},
		Env:  []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		User: "65532:65532", WorkingDir: "/",
	}
}

// RedisImage is Debian's redis-server and redis-cli with the shared
// libraries ldd finds for them, in place of the chart's default
// redis:…-alpine. As that image does, it runs redis-server with
// protected mode off (the chart's readiness probe runs redis-cli ping;
// relays connect from other pods without a password), and takes the
// chart's args after it.
func RedisImage(t testing.TB) ([]ImageFile, ImageConfig) {
	t.Helper()
	var files []ImageFile
	seen := map[string]bool{}
	add := func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, ImageFile{Path: p, From: real, Mode: 0o755})
	}
	for _, b := range []string{"redis-server", "redis-cli"} {
		p, err := exec.LookPath(b)
		if err != nil {
			t.Fatalf("%s: %v (apt-get install redis-server)", b, err)
		}
		add(p)
		libs, err := sharedLibs(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range libs {
			add(l)
		}
	}
	files = append(files,
		ImageFile{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nredis:x:999:999:redis:/data:/sbin/nologin\n")},
		ImageFile{Path: "/etc/group", Data: []byte("root:x:0:\nredis:x:999:\n")},
		ImageFile{Path: "/data", Dir: true, Mode: 0o777},
		ImageFile{Path: "/tmp", Dir: true, Mode: 0o1777},
	)
	return files, ImageConfig{
		Entrypoint: []string{"redis-server", "--protected-mode", "no"},
		Env:        []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"},
		User:       "999:999", WorkingDir: "/data",
	}
}

// ldd's "name => /path (0x…)" and "/path (0x…)" lines.
var lddLine = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$`)

// sharedLibs lists the shared libraries (and the dynamic loader) ldd
// resolves for bin.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	if !slices.ContainsFunc(libs, func(l string) bool { return strings.Contains(l, "ld-linux") }) {
		return nil, fmt.Errorf("ldd %s: no dynamic loader in\n%s", bin, out)
	}
	return libs, nil
}

// PauseImage builds the pod sandbox's process (./pause: it waits for
// SIGTERM or SIGINT and reaps orphans, as Kubernetes' pause does) and
// returns its image.
func PauseImage(t testing.TB) ([]ImageFile, ImageConfig) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./internal/testsupport/kube/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	return []ImageFile{{Path: "/pause", From: bin, Mode: 0o755}},
		ImageConfig{Entrypoint: []string{"/pause"}, User: "65535:65535", WorkingDir: "/"}
}
