package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestDockerfile checks the image against the module and the chart: the
// builder's Go is go.mod's, the binary is cmd/switchboard built static,
// the entrypoint is switchboard, and the image's user is the one the
// chart's pods run as.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(string(mod))
	if goVersion == nil || !strings.Contains(df, "ARG GO_VERSION="+goVersion[1]+"\n") {
		t.Errorf("the Dockerfile's GO_VERSION is not go.mod's go %v", goVersion)
	}
	for _, want := range []string{
		"./cmd/switchboard",
		"CGO_ENABLED=1",
		"-extldflags '-static -lm'",
		"nolibopusfile",
		`ENTRYPOINT ["switchboard"]`,
		"USER 65532:65532",
		// The in-cluster smoke test of docs/operations.md calls with it.
		"COPY --from=build /src/testdata/speech.wav /usr/share/switchboard/speech.wav",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// The final stage is the last FROM; it must not be a builder image.
	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(df, -1)
	if len(froms) < 2 || strings.Contains(froms[len(froms)-1][1], "golang") {
		t.Errorf("not a multi-stage build with a small final image: %v", froms)
	}

	r, err := render(t, withPublicIP(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range r.workloads() {
		sc := w.tmpl.Spec.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
			t.Errorf("%s/%s pods do not run as the image's user 65532", w.kind, w.name)
		}
		for _, c := range w.tmpl.Spec.Containers {
			if !readOnlyRoot(c) {
				t.Errorf("%s/%s container %s: root filesystem is writable", w.kind, w.name, c.Name)
			}
		}
	}

	ign, err := os.ReadFile(filepath.Join("..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ign), "\n!testdata/speech.wav\n") {
		t.Error(".dockerignore leaves testdata/speech.wav out, which the image carries for the smoke test")
	}
	ops, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ops), "-audio /usr/share/switchboard/speech.wav") {
		t.Error("docs/operations.md's smoke test does not call with the image's WAV file")
	}
	notesFound := false
	for name, notes := range r.files {
		notesFound = notesFound || strings.HasSuffix(name, "NOTES.txt")
		if strings.HasSuffix(name, "NOTES.txt") && !strings.Contains(notes, "call http://sb-switchboard-transceiver:8080/v1/calls -audio /usr/share/switchboard/speech.wav") {
			t.Errorf("NOTES.txt's smoke test does not call with the image's WAV file:\n%s", notes)
		}
	}
	if !notesFound {
		t.Error("the chart rendered no NOTES.txt")
	}
	for _, line := range strings.Split(string(ign), "\n") {
		// The build needs the module files and every non-test Go package.
		switch strings.TrimSpace(line) {
		case "go.mod", "go.sum", "cmd", "internal", "*.go", "**/*.go":
			t.Errorf(".dockerignore leaves out %q, which the build needs", line)
		}
	}
}

func readOnlyRoot(c corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem
}
