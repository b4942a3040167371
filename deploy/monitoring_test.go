package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The Prometheus Operator types are not in client-go's scheme; these
// carry the fields the chart uses, and decoding rejects any other.
type serviceMonitor struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func decodeCR(kind string, js []byte) error {
	var dst any
	switch kind {
	case "ServiceMonitor":
		dst = new(serviceMonitor)
	case "PrometheusRule":
		dst = new(prometheusRule)
	default:
		return fmt.Errorf("unexpected custom resource kind %q", kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// codeMetrics returns the metric names the code registers: every
// "switchboard_…" string literal outside tests, with _bucket, _sum and
// _count added for histograms.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	re := regexp.MustCompile(`"(switchboard_[a-z0-9_]+)"`)
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join("..", dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllSubmatch(b, -1) {
				out[string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for name := range out {
		if strings.HasSuffix(name, "_seconds") || strings.HasSuffix(name, "_ratio") { // the histograms
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = true
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no switchboard_ metrics found in the code")
	}
	return out
}

// reasonValues are the reason label values the code exports: relay drop
// reasons and session end reasons.
func reasonValues(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range []string{"internal/relay/drops.go", "internal/bridge/wire.go"} {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
	}
	return out
}

var (
	metricRe = regexp.MustCompile(`\bswitchboard_[a-z0-9_]+`)
	reasonRe = regexp.MustCompile(`reason=~?"([^"]+)"`)
)

// checkExpr reports metrics or reasons in a PromQL expression that the
// code does not export.
func checkExpr(t *testing.T, where, expr string, metrics, reasons map[string]bool) {
	t.Helper()
	names := metricRe.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: %q uses no switchboard metric", where, expr)
	}
	for _, n := range names {
		if !metrics[n] {
			t.Errorf("%s: metric %s is not exported by the code", where, n)
		}
	}
	for _, m := range reasonRe.FindAllStringSubmatch(expr, -1) {
		for _, r := range strings.Split(m[1], "|") {
			if !reasons[r] {
				t.Errorf("%s: reason %q is not a drop or end reason in the code", where, r)
			}
		}
	}
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("%s: unbalanced brackets in %q", where, expr)
	}
}

func TestAlertRules(t *testing.T) {
	vals := withPublicIP(map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true}, "serviceMonitor": map[string]any{"enabled": true}}})
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := r.crs["PrometheusRule/sb-switchboard"]
	if !ok {
		t.Fatalf("no PrometheusRule; have %v", r.keys())
	}
	js, _ := json.Marshal(raw)
	var pr prometheusRule
	if err := json.Unmarshal(js, &pr); err != nil {
		t.Fatal(err)
	}
	metrics, reasons := codeMetrics(t), reasonValues(t)
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, rule := range g.Rules {
			n++
			where := "alert " + rule.Alert
			checkExpr(t, where, rule.Expr, metrics, reasons)
			if !slices.Contains([]string{"critical", "warning", "info"}, rule.Labels["severity"]) {
				t.Errorf("%s: severity %q", where, rule.Labels["severity"])
			}
			if rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", where)
			}
			if !strings.Contains(rule.Expr, `namespace="voice"`) {
				t.Errorf("%s: not limited to the release's namespace", where)
			}
			// Each alert is explained in the operator guide.
			if !strings.Contains(string(doc), "`"+rule.Alert+"`") {
				t.Errorf("%s is not explained in docs/operations.md", where)
			}
		}
	}
	if n < 8 {
		t.Errorf("%d alert rules", n)
	}
	// The ServiceMonitors select the Services that carry the ports they name.
	for _, name := range []string{"ServiceMonitor/sb-switchboard-relay", "ServiceMonitor/sb-switchboard-transceiver"} {
		js, _ := json.Marshal(r.crs[name])
		var sm serviceMonitor
		if err := json.Unmarshal(js, &sm); err != nil {
			t.Fatal(err)
		}
		matched := 0
		for _, o := range r.objs {
			s, ok := o.(*corev1.Service)
			if !ok || !subset(sm.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			matched++
			if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port }) {
				t.Errorf("%s selects Service %s, which has no port %q", name, s.Name, sm.Spec.Endpoints[0].Port)
			}
		}
		if matched != 1 {
			t.Errorf("%s selects %d Services, want 1 (one target per pod)", name, matched)
		}
	}
}

func subset(want, have map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return len(want) > 0
}

func TestGrafanaDashboards(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in deploy/grafana: %v", err)
	}
	metrics, reasons := codeMetrics(t), reasonValues(t)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var d struct {
				UID           string `json:"uid"`
				Title         string `json:"title"`
				SchemaVersion int    `json:"schemaVersion"`
				Panels        []struct {
					Title   string `json:"title"`
					Type    string `json:"type"`
					Targets []struct {
						Expr string `json:"expr"`
					} `json:"targets"`
				} `json:"panels"`
				Templating struct {
					List []struct {
						Name string `json:"name"`
					} `json:"list"`
				} `json:"templating"`
			}
			if err := json.Unmarshal(b, &d); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
				t.Errorf("uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
			}
			vars := map[string]bool{}
			for _, v := range d.Templating.List {
				vars[v.Name] = true
			}
			exprs := 0
			for _, p := range d.Panels {
				for _, tg := range p.Targets {
					exprs++
					checkExpr(t, "panel "+p.Title, tg.Expr, metrics, reasons)
					for _, m := range regexp.MustCompile(`\$(\w+)`).FindAllStringSubmatch(tg.Expr, -1) {
						if !vars[m[1]] && !strings.HasPrefix(m[1], "__") {
							t.Errorf("panel %s: variable $%s is not defined", p.Title, m[1])
						}
					}
				}
			}
			if exprs < 10 {
				t.Errorf("%d queries", exprs)
			}
		})
	}
}
