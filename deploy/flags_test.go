package deploy

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// flagInfo is one flag of a switchboard subcommand, read from the source.
type flagInfo struct {
	Default string // the default expression as written, e.g. "0.0.0.0:3478" or 10*time.Second
}

// registerMethods are the flag.FlagSet methods that define a flag.
var registerMethods = map[string]bool{
	"String": true, "StringVar": true, "Int": true, "IntVar": true, "Int64": true, "Int64Var": true,
	"Uint": true, "UintVar": true, "Uint64": true, "Uint64Var": true, "Bool": true, "BoolVar": true,
	"Duration": true, "DurationVar": true, "Float64": true, "Float64Var": true,
	"Func": true, "BoolFunc": true, "Var": true, "TextVar": true,
}

// cmdSource is cmd/switchboard parsed once.
type cmdSource struct {
	fset  *token.FileSet
	funcs map[string]*ast.FuncDecl // "name" or "Recv.name"
	cmds  map[string]string        // subcommand → its run function
}

func parseCmd(t *testing.T) *cmdSource {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join("..", "cmd", "switchboard", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/switchboard sources: %v", err)
	}
	src := &cmdSource{fset: fset, funcs: map[string]*ast.FuncDecl{}, cmds: map[string]string{}}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				key := d.Name.Name
				if d.Recv != nil && len(d.Recv.List) == 1 {
					key = typeName(d.Recv.List[0].Type) + "." + key
				}
				src.funcs[key] = d
			case *ast.GenDecl:
				for _, s := range d.Specs {
					vs, ok := s.(*ast.ValueSpec)
					if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "commands" || len(vs.Values) != 1 {
						continue
					}
					lit, ok := vs.Values[0].(*ast.CompositeLit)
					if !ok {
						t.Fatal("commands is not a composite literal")
					}
					for _, e := range lit.Elts {
						row, ok := e.(*ast.CompositeLit)
						if !ok || len(row.Elts) < 2 {
							t.Fatal("commands: unexpected row shape")
						}
						name, _ := strconv.Unquote(row.Elts[0].(*ast.BasicLit).Value)
						fn, ok := row.Elts[len(row.Elts)-1].(*ast.Ident)
						if !ok {
							t.Fatalf("commands: %s: run function is not a plain name", name)
						}
						src.cmds[name] = fn.Name
					}
				}
			}
		}
	}
	if len(src.cmds) == 0 {
		t.Fatal("no commands table in cmd/switchboard")
	}
	return src
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// flags returns the flags of subcommand cmd: those its run function
// registers on its FlagSet, directly or through helpers it passes the
// FlagSet to.
func (s *cmdSource) flags(t *testing.T, cmd string) map[string]flagInfo {
	t.Helper()
	run, ok := s.cmds[cmd]
	if !ok {
		t.Fatalf("no subcommand %q", cmd)
	}
	out := map[string]flagInfo{}
	s.collect(t, s.funcs[run], out, map[string]bool{})
	return out
}

func (s *cmdSource) collect(t *testing.T, fn *ast.FuncDecl, out map[string]flagInfo, seen map[string]bool) {
	t.Helper()
	if fn == nil || fn.Body == nil {
		return
	}
	// Names bound to a *flag.FlagSet: parameters of that type, and
	// variables assigned from flag.NewFlagSet.
	fsNames := map[string]bool{}
	for _, p := range fn.Type.Params.List {
		if se, ok := p.Type.(*ast.StarExpr); ok && exprString(s.fset, se.X) == "flag.FlagSet" {
			for _, n := range p.Names {
				fsNames[n.Name] = true
			}
		}
	}
	// Field name → type name of struct-typed local variables (var cfg struct{…}).
	fieldTypes := map[string]string{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) == 1 && len(n.Rhs) == 1 {
				if c, ok := n.Rhs[0].(*ast.CallExpr); ok && exprString(s.fset, c.Fun) == "flag.NewFlagSet" {
					if id, ok := n.Lhs[0].(*ast.Ident); ok {
						fsNames[id.Name] = true
					}
				}
			}
		case *ast.StructType:
			for _, f := range n.Fields.List {
				for _, name := range f.Names {
					fieldTypes[name.Name] = exprString(s.fset, f.Type)
				}
			}
		}
		return true
	})
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && fsNames[id.Name] && registerMethods[sel.Sel.Name] {
				for i, a := range call.Args {
					lit, ok := a.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					name, _ := strconv.Unquote(lit.Value)
					info := flagInfo{}
					if !strings.HasSuffix(sel.Sel.Name, "Func") && i+1 < len(call.Args) {
						info.Default = exprString(s.fset, call.Args[i+1])
					}
					out[name] = info
					break
				}
				return true
			}
		}
		// A call that is handed the FlagSet registers flags too.
		passesFS := false
		for _, a := range call.Args {
			if id, ok := a.(*ast.Ident); ok && fsNames[id.Name] {
				passesFS = true
			}
		}
		if !passesFS {
			return true
		}
		var key string
		switch f := call.Fun.(type) {
		case *ast.Ident:
			key = f.Name
		case *ast.SelectorExpr:
			// cfg.Keys.register(fs): the method of the field's type.
			if inner, ok := f.X.(*ast.SelectorExpr); ok {
				key = strings.TrimPrefix(fieldTypes[inner.Sel.Name], "*") + "." + f.Sel.Name
			}
		}
		callee, ok := s.funcs[key]
		if !ok {
			t.Fatalf("%s: cannot resolve %s, which is handed the FlagSet; teach deploy/flags_test.go", s.fset.Position(call.Pos()), exprString(s.fset, call.Fun))
		}
		if !seen[key] {
			seen[key] = true
			s.collect(t, callee, out, seen)
			delete(seen, key)
		}
		return true
	})
}

func exprString(fset *token.FileSet, e ast.Expr) string {
	var b strings.Builder
	_ = printer.Fprint(&b, fset, e)
	return b.String()
}

// envName is the environment variable that sets flag name (flags.go).
func envName(flag string) string {
	return "SWITCHBOARD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func TestFlagsFromSource(t *testing.T) {
	src := parseCmd(t)
	for _, tt := range []struct {
		cmd  string
		want []string
	}{
		{"relay", []string{"public", "internal", "cluster", "members", "membership", "kube-service", "kube-port", "kube-id-offset", "metrics", "token-key", "token-key-id", "token-previous-key", "token-previous-key-id", "log-level", "config"}},
		{"transceiver", []string{"id", "cluster", "listen", "advertise", "backend", "http", "drain-timeout", "token-key", "log-format", "config"}},
		{"agent", []string{"listen", "log-level"}},
	} {
		t.Run(tt.cmd, func(t *testing.T) {
			got := src.flags(t, tt.cmd)
			for _, f := range tt.want {
				if _, ok := got[f]; !ok {
					t.Errorf("flag -%s not found among %v", f, keys(got))
				}
			}
		})
	}
	if got := src.flags(t, "relay")["public"].Default; got != `"0.0.0.0:3478"` {
		t.Errorf("relay -public default read as %s", got)
	}
}
