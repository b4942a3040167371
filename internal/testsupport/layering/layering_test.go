package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// module is the import path of the Switchboard module.
const module = "github.com/switchboard-rtc/switchboard"

// layers is the table of docs/design.md §8: every product package (paths
// relative to the module) and its layer. A package may import only
// packages of a lower layer, so two packages of one layer never import
// each other. A new product package must be placed here.
var layers = map[string]int{
	// Leaves: import nothing of the module.
	"internal/audio":      0,
	"internal/bridge":     0,
	"internal/flowstore":  0,
	"internal/httpapi":    0,
	"internal/membership": 0,
	"internal/playout":    0,
	"internal/rtcpreport": 0,
	"internal/sdpfrag":    0,
	"internal/stunpeek":   0,
	"internal/token":      0,
	"internal/trusted":    0,
	"internal/udpio":      0,
	"internal/vad":        0,
	"internal/apm":        0,
	"internal/web":        0,

	"internal/agent":      1, // bridge, vad
	"internal/auth":       1, // httpapi
	"internal/callclient": 1, // sdpfrag
	"internal/hop":        1, // udpio, trusted
	"internal/peer":       1, // stunpeek

	"internal/director":    2, // auth, httpapi, trusted
	"internal/relay":       2, // udpio, hop, stunpeek, token, membership, trusted
	"internal/transceiver": 2, // peer, hop, udpio, token, bridge, audio, …

	"internal/demo": 3, // relay, transceiver, agent, membership, token, web

	"internal/config": 4, // the packages whose settings it layers

	"cmd/switchboard": 5,
}

// tooling names the module's test support and benchmarks (paths relative
// to the module, each with what lies under it): the product may not
// depend on them, directly or not.
var tooling = []string{
	"bench",
	"cmd/switchboard-bench",
	"deploy", // tests of the manifests and the image
	"internal/testsupport",
	"internal/audio/audiotest",
}

// testOnly names third-party modules that only tests and benchmarks may
// use, matched as import path prefixes.
var testOnly = []string{
	"github.com/chromedp/",
	"go.uber.org/goleak",
}

// platforms are the GOOS/GOARCH pairs whose import graphs are checked:
// Linux-only files have portable twins, and both must keep the layers.
var platforms = [][2]string{{"linux", "amd64"}, {"darwin", "arm64"}}

// pkg is the part of `go list -json` the test reads.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// under reports whether path is dir or lies below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// isTooling reports whether the module-relative path is test support or
// a benchmark.
func isTooling(rel string) bool {
	return slices.ContainsFunc(tooling, func(dir string) bool { return under(rel, dir) })
}

// local returns path relative to the module, and whether it is in it.
func local(path string) (string, bool) {
	if !under(path, module) {
		return "", false
	}
	return strings.TrimPrefix(strings.TrimPrefix(path, module), "/"), true
}

// list runs `go list -json` on every package of the module for one
// platform.
func list(t *testing.T, goos, goarch string) []pkg {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,Error", module+"/...")
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=1", "GOFLAGS=-mod=mod")
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list for %s/%s: %v\n%s", goos, goarch, err, stderr.Bytes())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(&out); ; {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list for %s/%s listed no packages", goos, goarch)
	}
	return pkgs
}

// violations checks one platform's packages against the layer table and
// returns a line per broken rule.
func violations(pkgs []pkg, layers map[string]int) []string {
	var bad []string
	seen := map[string]bool{}
	table := map[string]bool{}
	for rel := range layers {
		table[rel] = true
	}
	for _, p := range pkgs {
		rel, ok := local(p.ImportPath)
		if !ok || isTooling(rel) {
			continue
		}
		seen[rel] = true
		if p.Error != nil {
			bad = append(bad, fmt.Sprintf("%s: %s", rel, p.Error.Err))
			continue
		}
		layer, placed := layers[rel]
		if !placed {
			bad = append(bad, fmt.Sprintf("%s is not in the layer table (docs/design.md §8, layers in this test)", rel))
			continue
		}
		for _, imp := range p.Imports {
			irel, ok := local(imp)
			if !ok {
				continue
			}
			if isTooling(irel) {
				continue // reported below, with the indirect ones
			}
			ilayer, placed := layers[irel]
			switch {
			case !placed:
				// Reported when the imported package itself is visited.
			case ilayer >= layer:
				bad = append(bad, fmt.Sprintf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", rel, layer, irel, ilayer))
			case table[parent(irel)] && !under(rel, parent(irel)):
				// A package inside another's directory belongs to it;
				// sharing it runs an import up into that package.
				bad = append(bad, fmt.Sprintf("%s imports %s, which lives inside %s: move it out to share it", rel, irel, parent(irel)))
			}
		}
		for _, dep := range p.Deps {
			if drel, ok := local(dep); ok && isTooling(drel) {
				bad = append(bad, fmt.Sprintf("product package %s depends on test support or benchmarks: %s", rel, drel))
			}
		}
		for _, prefix := range testOnly {
			// One line per module: chromedp alone brings a hundred packages.
			if i := slices.IndexFunc(p.Deps, func(dep string) bool { return strings.HasPrefix(dep, prefix) }); i >= 0 {
				bad = append(bad, fmt.Sprintf("product package %s depends on test-only module package %s", rel, p.Deps[i]))
			}
		}
	}
	for rel := range layers {
		if !seen[rel] {
			bad = append(bad, fmt.Sprintf("%s is in the layer table but not in the module", rel))
		}
	}
	slices.Sort(bad)
	return slices.Compact(bad)
}

// parent is the directory above a module-relative package path.
func parent(rel string) string {
	i := strings.LastIndex(rel, "/")
	if i < 0 {
		return ""
	}
	return rel[:i]
}

// TestLayers fails when a product package imports test support, a
// benchmark or a test-only module, directly or not, or imports a package
// of its own or a higher layer, on any of the platforms.
func TestLayers(t *testing.T) {
	for _, pl := range platforms {
		t.Run(pl[0]+"/"+pl[1], func(t *testing.T) {
			for _, v := range violations(list(t, pl[0], pl[1]), layers) {
				t.Error(v)
			}
		})
	}
}

// TestViolationsCanFail feeds the checker a graph that breaks each rule
// and expects each to be reported, so that TestLayers cannot pass by
// checking nothing.
func TestViolationsCanFail(t *testing.T) {
	m := func(rel string) string { return module + "/" + rel }
	base := func() []pkg {
		var pkgs []pkg
		for rel := range layers {
			pkgs = append(pkgs, pkg{ImportPath: m(rel)})
		}
		return pkgs
	}
	set := func(pkgs []pkg, rel string, p pkg) []pkg {
		for i := range pkgs {
			if pkgs[i].ImportPath == m(rel) {
				p.ImportPath = m(rel)
				pkgs[i] = p
			}
		}
		return pkgs
	}
	withNested := func() map[string]int {
		l := maps.Clone(layers)
		l["internal/relay/udpio"] = 0
		return l
	}
	tests := []struct {
		name   string
		pkgs   []pkg
		layers func() map[string]int // nil: the table
		want   string
	}{
		{
			name: "lower imports higher",
			pkgs: set(base(), "internal/hop", pkg{Imports: []string{m("internal/relay")}}),
			want: "internal/hop (layer 1) imports internal/relay (layer 2)",
		},
		{
			name: "same layer",
			pkgs: set(base(), "internal/relay", pkg{Imports: []string{m("internal/transceiver")}}),
			want: "internal/relay (layer 2) imports internal/transceiver (layer 2)",
		},
		{
			name: "product imports test support",
			pkgs: set(base(), "internal/token", pkg{Imports: []string{m("internal/testsupport/logbuf")}, Deps: []string{m("internal/testsupport/logbuf")}}),
			want: "product package internal/token depends on test support or benchmarks: internal/testsupport/logbuf",
		},
		{
			name: "product depends on a benchmark indirectly",
			pkgs: set(base(), "cmd/switchboard", pkg{Deps: []string{m("bench/relay")}}),
			want: "product package cmd/switchboard depends on test support or benchmarks: bench/relay",
		},
		{
			name: "product depends on chromedp",
			pkgs: set(base(), "internal/demo", pkg{Deps: []string{"github.com/chromedp/chromedp"}}),
			want: "product package internal/demo depends on test-only module package github.com/chromedp/chromedp",
		},
		{
			name:   "import into another package's directory",
			pkgs:   append(set(base(), "internal/hop", pkg{Imports: []string{m("internal/relay/udpio")}}), pkg{ImportPath: m("internal/relay/udpio")}),
			layers: withNested,
			want:   "internal/hop imports internal/relay/udpio, which lives inside internal/relay",
		},
		{
			name: "unplaced package",
			pkgs: append(base(), pkg{ImportPath: m("internal/newthing")}),
			want: "internal/newthing is not in the layer table",
		},
		{
			name: "stale table entry",
			pkgs: slices.DeleteFunc(base(), func(p pkg) bool { return p.ImportPath == m("internal/vad") }),
			want: "internal/vad is in the layer table but not in the module",
		},
	}
	for _, tt := range tests {
		if tt.layers == nil {
			tt.layers = func() map[string]int { return layers }
		}
		t.Run(tt.name, func(t *testing.T) {
			got := violations(tt.pkgs, tt.layers())
			if !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, tt.want) }) {
				t.Errorf("violations = %q, want one containing %q", got, tt.want)
			}
		})
	}
	if got := violations(base(), layers); len(got) != 0 {
		t.Errorf("violations of the table itself = %q, want none", got)
	}
}
