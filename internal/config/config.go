// Package config holds the settings of the server subcommands of
// cmd/switchboard: each one's config struct, its flag set with defaults
// taken from the component packages' Default… constants, and Parse, which
// layers the defaults, a YAML file, SWITCHBOARD_<FLAG> environment
// variables (SWITCHBOARD_<COMMAND>_<FLAG> for -mode and -listen, whose
// meaning differs between commands) and the command line. Tests (deploy/)
// build the same flag sets to check the Helm chart against them.
package config

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/switchboard-rtc/switchboard/internal/auth"
	"github.com/switchboard-rtc/switchboard/internal/token"
)

// FileOnly is a setting that only the YAML file sets (no flag): its key
// and what it does, for -h.
type FileOnly struct{ Key, Help string }

// AddFileFlag adds -config, the YAML file, to fs, and has fs's usage list
// fileOnly after the flags.
func AddFileFlag(fs *flag.FlagSet, fileOnly ...FileOnly) {
	fs.String("config", "", "YAML config file; environment variables and flags override it")
	if len(fileOnly) == 0 {
		return
	}
	usage := fs.Usage
	fs.Usage = func() {
		if usage != nil {
			usage()
		} else {
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		fmt.Fprintln(fs.Output(), "\nSettings only in the YAML file (-config):")
		for _, y := range fileOnly {
			fmt.Fprintf(fs.Output(), "  %s\n    \t%s\n", y.Key, y.Help)
		}
	}
}

// nameEnv appends to each flag's help the environment variable that sets
// it, for -h.
func nameEnv(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " [$" + CommandEnvName(fs.Name(), f.Name) + "]" })
}

// Parse fills a subcommand's config from, in rising precedence: flag
// defaults, the YAML file named by -config, SWITCHBOARD_<FLAG> environment
// variables (CommandEnvName, with the subcommand the name of fs), and
// flags given on the command line. The file
// itself is named like any flag: -config or SWITCHBOARD_CONFIG. dst is the
// struct the flags of fs are bound to, whose yaml tags name the file's
// keys; an unknown key is an error. The old shared variable of a flag
// named per subcommand (SWITCHBOARD_MODE, SWITCHBOARD_LISTEN) is an error
// that names the subcommand's own, unless the flag is on the command
// line. Parse adds -config (AddFileFlag) if fs lacks it.
func Parse(fs *flag.FlagSet, args []string, dst any) error {
	if fs.Lookup("config") == nil {
		AddFileFlag(fs)
	}
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; run 'switchboard %s -h' for the flags", fs.Arg(0), fs.Name())
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	configPath := fs.Lookup("config").Value.String()
	if !explicit["config"] {
		if v, ok := os.LookupEnv(EnvName("config")); ok {
			configPath = v
		}
	}
	if configPath != "" {
		b, err := os.ReadFile(configPath)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if err := decodeFile(b, dst); err != nil {
			return fmt.Errorf("config %s: %w", configPath, err)
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if explicit[f.Name] || err != nil || f.Name == "config" {
			return
		}
		env := CommandEnvName(fs.Name(), f.Name)
		if old := EnvName(f.Name); old != env {
			// Renamed: say so rather than run on the default.
			if _, ok := os.LookupEnv(old); ok {
				err = fmt.Errorf("%s is no longer read (-%s means something else in each command; `switchboard %s -%s`: %s): set %s instead",
					old, f.Name, fs.Name(), f.Name, strings.TrimSuffix(f.Usage, " [$"+env+"]"), env)
				return
			}
		}
		if v, ok := os.LookupEnv(env); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, valueError(f, v, serr))
			}
		}
	})
	if err != nil {
		return err
	}
	// Parse again so that flags given on the command line win over the
	// file and the environment.
	return ParseFlags(fs, args)
}

// ParseFlags is fs.Parse(args) for a command of the switchboard binary
// (fs named after it), with errors a newcomer can act on: a bad flag or
// value is one line that says what to fix and points to -h, in place of
// the flag package's error followed by the whole usage; a bad duration
// says how to write one (60s); an unknown flag names the nearest one.
// -h and -help print the usage to stderr and return flag.ErrHelp.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	}
	return fmt.Errorf("%w; run 'switchboard %s -h' for the flags", flagError(fs, err), fs.Name())
}

// Errors of the flag package, as Parse words them (Go 1.21 on).
var (
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.+)$`)
	flagBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]+): (.*)$`)
)

// flagError rewrites the flag package's error err of fs: an unknown flag
// with the nearest defined one, a bad value with valueError's wording.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if m := flagUndefined.FindStringSubmatch(msg); m != nil {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if near := nearest(m[1], names); near != "" {
			return fmt.Errorf("no flag -%s (did you mean -%s?)", m[1], near)
		}
		return fmt.Errorf("no flag -%s", m[1])
	}
	if m := flagBadValue.FindStringSubmatch(msg); m != nil {
		if f := fs.Lookup(m[2]); f != nil {
			return fmt.Errorf("-%s %q: %w", f.Name, m[1], valueError(f, m[1], errors.New(m[3])))
		}
	}
	return err
}

// valueError words the error err of setting flag f to v: for a duration
// flag, how to write one; for a number, that it wants one; otherwise err.
func valueError(f *flag.Flag, v string, err error) error {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	switch g.Get().(type) {
	case time.Duration:
		return durationError(v)
	case int, int64, uint, uint64:
		return fmt.Errorf("want a whole number, such as %s", f.DefValue)
	case float64:
		return fmt.Errorf("want a number, such as %s", f.DefValue)
	case bool:
		return errors.New("want true or false")
	}
	return err
}

// durationError says that v is not a duration and how to write one.
func durationError(v string) error {
	hint := "60s"
	if _, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
		hint = strings.TrimSpace(v) + "s" // a bare number: seconds were most likely meant
	}
	return fmt.Errorf("not a duration: write a number with a unit, such as %s (units: ms, s, m, h)", hint)
}

// nearest returns the name of names closest to name: one that contains
// it or is contained in it, or else within a third of its length in
// edits (at least 2); "" if none is.
func nearest(name string, names []string) string {
	best, bestD := "", max(2, len(name)/3)+1
	for _, n := range names {
		if n == name {
			continue
		}
		if strings.Contains(n, name) || strings.Contains(name, n) {
			return n
		}
		if d := editDistance(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// List is a list setting of the YAML file: a YAML sequence of strings,
// or, as the setting's flag takes it (listVar), one comma-separated
// string; either way items are trimmed of spaces and must not be empty ("a, b" is [a b];
// "a,,b" is an error). Anything else (a mapping) is an error with its
// line. Parse decodes every []string of a config into a List.
type List []string

// UnmarshalYAML implements yaml.v3's Unmarshaler; an error names the
// value's line.
func (l *List) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.SequenceNode:
		var items []string
		if err := n.Decode(&items); err != nil {
			return err
		}
		for i, it := range items {
			if items[i] = strings.TrimSpace(it); items[i] == "" {
				return &listError{n.Content[i].Line, n.Content[i].Column, "", "an empty item"}
			}
		}
		*l = items
		return nil
	case yaml.ScalarNode:
		if strings.TrimSpace(n.Value) == "" {
			return &listError{n.Line, n.Column, "", "an empty string (write [] for no values)"}
		}
		items, err := splitList(n.Value)
		if err != nil {
			return &listError{n.Line, n.Column, "", err.Error()}
		}
		*l = items
		return nil
	}
	return &listError{n.Line, n.Column, "", "got a mapping"} // aliases come resolved
}

// splitList splits v, a list setting as one comma-separated string, the
// way both its flag and the YAML file take it: items trimmed of spaces, an
// empty item an error naming v. A blank v is no items.
func splitList(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var items []string
	for it := range strings.SplitSeq(v, ",") {
		if it = strings.TrimSpace(it); it == "" {
			return nil, fmt.Errorf("an empty item in %q", strings.TrimSpace(v))
		}
		items = append(items, it)
	}
	return items, nil
}

// listVar adds the list flag name to fs, writing into dst: a
// comma-separated string split by splitList, so the flag (and its
// environment variable) takes what the YAML file's List takes. An empty
// value is no items.
func listVar(fs *flag.FlagSet, dst *[]string, name, usage string) {
	fs.Func(name, usage, func(v string) error {
		items, err := splitList(v)
		if err != nil {
			return err
		}
		*dst = items
		return nil
	})
}

// listError is a List setting of the YAML file that is neither a list
// nor a comma-separated string of non-empty items.
type listError struct {
	Line, Column int    // of the value, from 1
	Key          string // dotted path of the setting (auth.api_keys), when known
	Got          string // what is wrong with the value
}

func (e *listError) Error() string {
	key := e.Key
	if key == "" {
		key = "a list setting"
	}
	return fmt.Sprintf("line %d: %s: %s; want a YAML list, or one comma-separated string, of values", e.Line, key, e.Got)
}

// decodeFile decodes the YAML file b into dst (a pointer to a config
// struct), refusing unknown keys, with every []string of dst taken as a
// List: dst's values are copied into a twin of its type with List in
// place of []string (decodeType), the file is decoded into the twin, and
// the result copied back.
func decodeFile(b []byte, dst any) error {
	v := reflect.ValueOf(dst).Elem()
	twin := reflect.New(decodeType(v.Type()))
	assign(twin.Elem(), v)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	err := dec.Decode(twin.Interface())
	if errors.Is(err, io.EOF) {
		return nil // an empty file
	}
	if err != nil {
		var le *listError
		if errors.As(err, &le) {
			var doc yaml.Node
			if yaml.Unmarshal(b, &doc) == nil {
				le.Key = keyAt(&doc, le.Line, le.Column, "")
			}
			return le
		}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return syntaxError(b, err)
		}
		return fileError(te, b, dst)
	}
	assign(v, twin.Elem())
	return nil
}

var (
	stringsType     = reflect.TypeFor[[]string]()
	listType        = reflect.TypeFor[List]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodeType returns t with List in place of every []string in its
// structs (exported fields not tagged "-"), maps, slices and pointers;
// t itself if it has none, or decodes itself (yaml.Unmarshaler,
// encoding.TextUnmarshaler).
func decodeType(t reflect.Type) reflect.Type {
	if t == stringsType {
		return listType
	}
	if p := reflect.PointerTo(t); p.Implements(unmarshalerType) || p.Implements(textType) {
		return t
	}
	switch t.Kind() {
	case reflect.Pointer:
		if e := decodeType(t.Elem()); e != t.Elem() {
			return reflect.PointerTo(e)
		}
	case reflect.Slice:
		if e := decodeType(t.Elem()); e != t.Elem() {
			return reflect.SliceOf(e)
		}
	case reflect.Map:
		if e := decodeType(t.Elem()); e != t.Elem() {
			return reflect.MapOf(t.Key(), e)
		}
	case reflect.Struct:
		var fields []reflect.StructField
		changed := false
		for f := range t.Fields() {
			if !f.IsExported() || f.Tag.Get("yaml") == "-" {
				continue // not decoded; assign leaves it as it is
			}
			ft := decodeType(f.Type)
			changed = changed || ft != f.Type
			fields = append(fields, reflect.StructField{Name: f.Name, Type: ft, Tag: f.Tag})
		}
		if changed {
			return reflect.StructOf(fields)
		}
	}
	return t
}

// assign sets dst to src, whose types are the same but for List in place
// of []string (decodeType); a struct field that one of them lacks is left
// as it is.
func assign(dst, src reflect.Value) {
	switch {
	case dst.Type() == src.Type():
		dst.Set(src)
	case src.Kind() == reflect.Slice && src.Type().Elem().Kind() == reflect.String:
		dst.Set(src.Convert(dst.Type())) // List and []string
	case src.Kind() == reflect.Struct:
		for i := range src.NumField() {
			f := src.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if df, ok := dst.Type().FieldByName(f.Name); ok && len(df.Index) == 1 {
				assign(dst.Field(df.Index[0]), src.Field(i))
			}
		}
	case src.IsNil():
		dst.SetZero()
	case src.Kind() == reflect.Pointer:
		p := reflect.New(dst.Type().Elem())
		assign(p.Elem(), src.Elem())
		dst.Set(p)
	case src.Kind() == reflect.Slice:
		s := reflect.MakeSlice(dst.Type(), src.Len(), src.Len())
		for i := range src.Len() {
			assign(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	case src.Kind() == reflect.Map:
		m := reflect.MakeMapWithSize(dst.Type(), src.Len())
		for it := src.MapRange(); it.Next(); {
			e := reflect.New(dst.Type().Elem()).Elem()
			assign(e, it.Value())
			m.SetMapIndex(it.Key(), e)
		}
		dst.Set(m)
	}
}

// keyAt returns the dotted key path (in below path) of the value that
// starts at line and column in n, or "" if none does.
func keyAt(n *yaml.Node, line, column int, path string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if k := keyAt(c, line, column, path); k != "" {
				return k
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := joinKey(path, n.Content[i].Value), n.Content[i+1]
			if val.Line == line && val.Column == column {
				return key
			}
			if k := keyAt(val, line, column, key); k != "" {
				return k
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			key := fmt.Sprintf("%s[%d]", path, i)
			if c.Line == line && c.Column == column {
				return key
			}
			if k := keyAt(c, line, column, key); k != "" {
				return k
			}
		}
	}
	return ""
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlKeys appends the top-level YAML keys of struct type t (inline
// fields' keys included), in field order, to keys.
func yamlKeys(t reflect.Type, keys []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return keys
	}
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case strings.Contains(opts, "inline"):
			keys = yamlKeys(f.Type, keys)
		case name != "":
			keys = append(keys, name)
		default:
			keys = append(keys, strings.ToLower(f.Name))
		}
	}
	return keys
}

// Errors of yaml.v3 (v3.0.1) that fileError and syntaxError reword.
var (
	// unknownField: a key that dst has no field for.
	unknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type .+$`)
	// badType: a value that does not decode into its field's type (a
	// type yaml.v3 names by its literal has spaces: "struct { Cluster …").
	badType = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+) (?:`(.*)` )?into (.+)$")
	// syntaxLine: a syntax error, with the line yaml.v3 gives, if any.
	syntaxLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)
)

// fileError rewrites yaml.v3's type errors te of the file b, decoded into
// dst: an unknown key with the nearest key of its mapping ("did you mean
// backend_url?"); a value of the wrong type with its key and what it
// wants (a duration "such as 30s").
func fileError(te *yaml.TypeError, b []byte, dst any) error {
	var doc yaml.Node
	_ = yaml.Unmarshal(b, &doc) // it parsed, or there would be no TypeError
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = m
		if sub := unknownField.FindStringSubmatch(m); sub != nil {
			line, _ := strconv.Atoi(sub[1])
			msgs[i] = fmt.Sprintf("line %d: unknown key %q", line, sub[2])
			known := keysBeside(&doc, reflect.TypeOf(dst), line, sub[2])
			if near := nearest(sub[2], known); near != "" {
				msgs[i] += fmt.Sprintf(" (did you mean %s?)", near)
			}
		} else if sub := badType.FindStringSubmatch(m); sub != nil {
			line, _ := strconv.Atoi(sub[1])
			got, value, into := sub[2], sub[3], sub[4]
			key := keyOnLine(&doc, line, "")
			if key == "" {
				key = "a setting"
			}
			switch {
			case into == "time.Duration":
				msgs[i] = fmt.Sprintf("line %d: %s: %q is %s", line, key, value, durationError(value))
			case value == "":
				msgs[i] = fmt.Sprintf("line %d: %s: got a %s, want %s", line, key, yamlKind(got), goKind(into))
			default:
				msgs[i] = fmt.Sprintf("line %d: %s: %q is not %s", line, key, value, goKind(into))
			}
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// yamlKind names a YAML tag ("seq") for a person.
func yamlKind(tag string) string {
	switch tag {
	case "seq":
		return "list"
	case "map":
		return "mapping"
	}
	return tag
}

// goKind names a Go type of a setting for a person.
func goKind(t string) string {
	switch {
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map[") || strings.HasPrefix(t, "struct {"):
		return "a mapping"
	}
	return "a " + t
}

// keyOnLine returns the dotted path (below path) of the last mapping key
// in n on line, or whose value starts on line, or "".
func keyOnLine(n *yaml.Node, line int, path string) string {
	found := ""
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p := path
			if n.Kind == yaml.SequenceNode {
				if p = fmt.Sprintf("%s[%d]", path, i); c.Line == line && c.Kind != yaml.ScalarNode {
					found = p
				}
			}
			if k := keyOnLine(c, line, p); k != "" {
				found = k
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := joinKey(path, n.Content[i].Value)
			if n.Content[i].Line == line || n.Content[i+1].Line == line {
				found = key // the key's line, or the line where its list or mapping starts
			}
			if k := keyOnLine(n.Content[i+1], line, key); k != "" {
				found = k
			}
		}
	}
	return found
}

// keysBeside returns the YAML keys that the mapping holding key name on
// line may have: those of the struct type (within t, dst's type) that the
// mapping decodes into; the top-level keys if it is not found.
func keysBeside(doc *yaml.Node, t reflect.Type, line int, name string) []string {
	var walk func(n *yaml.Node, t reflect.Type) []string
	walk = func(n *yaml.Node, t reflect.Type) []string {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if k := walk(c, t); k != nil {
					return k
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if k.Line == line && k.Value == name {
					return yamlKeys(t, nil)
				}
				if ft, ok := fieldType(t, k.Value); ok {
					if keys := walk(v, ft); keys != nil {
						return keys
					}
				}
			}
		}
		return nil
	}
	if keys := walk(doc, t); keys != nil {
		return keys
	}
	return yamlKeys(t, nil)
}

// fieldType returns the type of the field of struct type t (inline
// fields' included) whose YAML key is key; of the elements, for a map or
// a slice.
func fieldType(t reflect.Type, key string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Map || t.Kind() == reflect.Slice {
		return t.Elem(), true
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for f := range t.Fields() {
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case strings.Contains(opts, "inline"):
			if ft, ok := fieldType(f.Type, key); ok {
				return ft, true
			}
		case name == key || (name == "" && strings.ToLower(f.Name) == key):
			return f.Type, true
		}
	}
	return nil, false
}

// syntaxError rewrites a YAML syntax error err of the file b so that it
// names the line to fix: yaml.v3 counts the lines of its parser's errors
// ("did not find expected …") from 0 and those of its scanner from 1, and
// names the line where a quoted value, list or mapping began, not where
// the file went wrong. A tab in the indentation (YAML indents with
// spaces) and a quote never closed are named by their own line.
func syntaxError(b []byte, err error) error {
	sub := syntaxLine.FindStringSubmatch(err.Error())
	if sub == nil {
		return err
	}
	line, _ := strconv.Atoi(sub[1])
	problem := sub[2]
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if strings.Contains(indent, "\t") && strings.TrimSpace(l) != "" {
			return fmt.Errorf("line %d: a tab in the indentation: YAML indents with spaces only", i+1)
		}
	}
	if strings.HasPrefix(problem, "did not find expected") || strings.HasPrefix(problem, "found duplicate %") ||
		strings.HasPrefix(problem, "found incompatible") || strings.HasPrefix(problem, "found undefined tag") {
		line++ // the parser's errors count from 0; no line at all is the first
	}
	if problem == "found unexpected end of stream" {
		for i, l := range lines {
			if q := openQuote(l); q != 0 {
				return fmt.Errorf("line %d: the %c that opens a value is never closed", i+1, q)
			}
		}
	}
	if line == 0 {
		return fmt.Errorf("yaml: %s", problem)
	}
	return fmt.Errorf("line %d: %s", line, problem)
}

// openQuote returns the quote character (' or ") that opens the value of
// a "key: value" or "- value" line and is not closed on it, or 0.
func openQuote(l string) byte {
	v := strings.TrimSpace(l)
	if strings.HasPrefix(v, "#") {
		return 0
	}
	if strings.HasPrefix(v, "- ") {
		v = strings.TrimSpace(v[2:])
	} else if _, after, ok := strings.Cut(v, ": "); ok {
		v = strings.TrimSpace(after)
	}
	if v == "" || (v[0] != '"' && v[0] != '\'') {
		return 0
	}
	q := v[0]
	for i := 1; i < len(v); i++ {
		switch {
		case q == '"' && v[i] == '\\':
			i++
		case v[i] == q && q == '\'' && i+1 < len(v) && v[i+1] == '\'':
			i++ // '' is a quote inside single quotes
		case v[i] == q:
			return 0
		}
	}
	return q
}

// EnvName is the environment variable that sets flag name in every
// subcommand that has it: SWITCHBOARD_ and the name in upper case, dashes
// as underscores (-token-key: SWITCHBOARD_TOKEN_KEY). The flags of
// perCommandEnv are the exception; CommandEnvName names every flag.
func EnvName(name string) string {
	return "SWITCHBOARD_" + envPart(name)
}

// perCommandEnv are the flags that mean different things in different
// subcommands: -mode is the agent's parrot or echo and the director's
// proxy or redirect; -listen is the transceiver's internal-hop UDP socket
// and the agent's and the director's HTTP address. Their variable carries
// the subcommand's name, so that one meant for one command, exported in a
// shell or set in an env file or ConfigMap that several commands share,
// does not reach another.
var perCommandEnv = map[string]bool{"mode": true, "listen": true}

// CommandEnvName is the environment variable that sets flag name of
// subcommand cmd: EnvName(name), or for a flag whose meaning differs
// between subcommands (-mode, -listen), SWITCHBOARD_<CMD>_<FLAG>, e.g.
// SWITCHBOARD_AGENT_MODE, SWITCHBOARD_DIRECTOR_MODE, SWITCHBOARD_DEMO_MODE,
// SWITCHBOARD_TRANSCEIVER_LISTEN, SWITCHBOARD_AGENT_LISTEN,
// SWITCHBOARD_DIRECTOR_LISTEN.
func CommandEnvName(cmd, name string) string {
	if perCommandEnv[name] {
		return "SWITCHBOARD_" + envPart(cmd) + "_" + envPart(name)
	}
	return EnvName(name)
}

// envPart is name in upper case, dashes as underscores.
func envPart(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Keys names the fleet token keys (package token) of relays and
// transceivers. Secrets are base64 (standard or URL alphabet) or hex, at
// least 16 bytes.
type Keys struct {
	Key           string `yaml:"token_key"`
	KeyID         uint   `yaml:"token_key_id"`
	PreviousKey   string `yaml:"token_previous_key"`
	PreviousKeyID uint   `yaml:"token_previous_key_id"`
	MaxAge        string `yaml:"token_max_age"`
}

// RegisterFlags adds the -token-* flags to fs, writing into k.
func (k *Keys) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&k.Key, "token-key", "", "current fleet token secret (base64 or hex, >= 16 bytes); required")
	fs.UintVar(&k.KeyID, "token-key-id", 0, "id of the current token key (0-63)")
	fs.StringVar(&k.PreviousKey, "token-previous-key", "", "previous fleet token secret, still accepted during a rotation")
	fs.UintVar(&k.PreviousKeyID, "token-previous-key-id", 0, "id of the previous token key (0-63)")
	fs.StringVar(&k.MaxAge, "token-max-age", "", "relays drop tokens older than this (token_expired), e.g. 24h; keep it above the longest session; empty or 0: no bound")
}

func decodeSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	for _, dec := range []func(string) ([]byte, error){
		hex.DecodeString,
		base64.StdEncoding.DecodeString,
		base64.RawStdEncoding.DecodeString,
		base64.URLEncoding.DecodeString,
		base64.RawURLEncoding.DecodeString,
	} {
		if b, err := dec(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not hex or base64")
}

// Keyring builds the token keyring. Its errors say what to fix: a missing
// key, ids beyond token.MaxKeyID, a secret that is not hex or base64 or
// shorter than 16 bytes, a bad -token-max-age.
func (k *Keys) Keyring() (*token.Keyring, error) {
	if k.Key == "" {
		return nil, errors.New("a fleet token key is required: set -token-key or SWITCHBOARD_TOKEN_KEY to 32 random bytes in base64 (e.g. `openssl rand -base64 32`), the same on every relay and transceiver")
	}
	if k.KeyID > token.MaxKeyID || k.PreviousKeyID > token.MaxKeyID {
		return nil, fmt.Errorf("token key ids must be 0-%d", token.MaxKeyID)
	}
	cur, err := decodeSecret(k.Key)
	if err != nil {
		return nil, fmt.Errorf("-token-key: %w", err)
	}
	if len(cur) < token.MinSecretLen {
		return nil, fmt.Errorf("-token-key: secret is %d bytes, need at least %d (e.g. `openssl rand -base64 32`)", len(cur), token.MinSecretLen)
	}
	var prev []token.Key
	if k.PreviousKey != "" {
		b, err := decodeSecret(k.PreviousKey)
		if err != nil {
			return nil, fmt.Errorf("-token-previous-key: %w", err)
		}
		if len(b) < token.MinSecretLen {
			return nil, fmt.Errorf("-token-previous-key: secret is %d bytes, need at least %d", len(b), token.MinSecretLen)
		}
		prev = append(prev, token.Key{ID: uint8(k.PreviousKeyID), Secret: b})
	}
	kr, err := token.NewKeyring(token.Key{ID: uint8(k.KeyID), Secret: cur}, prev...)
	if err != nil || k.MaxAge == "" {
		return kr, err
	}
	if kr.MaxAge, err = time.ParseDuration(k.MaxAge); err != nil || kr.MaxAge < 0 {
		return nil, fmt.Errorf("-token-max-age %q: want a duration such as 24h, or 0 for no bound", k.MaxAge)
	}
	return kr, nil
}

// RegisterAuthFlags adds the signaling authentication flags (package auth)
// to fs, writing into a. Secrets are better set through the environment
// (SWITCHBOARD_AUTH_SIGNING_KEY, SWITCHBOARD_AUTH_API_KEYS) or the YAML
// file's auth section than on a command line.
func RegisterAuthFlags(fs *flag.FlagSet, a *auth.Config) {
	fs.StringVar(&a.SigningKey, "auth-signing-key", "", "base64 HS256 key (>= 32 bytes) of client tokens, shared by every transceiver and director; empty with no -auth-api-keys: signaling is open")
	fs.StringVar(&a.PreviousSigningKey, "auth-previous-signing-key", "", "a second HS256 key that verifies (never signs) client tokens during a signing-key rotation")
	listVar(fs, &a.APIKeys, "auth-api-keys", "comma-separated server-side API keys (>= 32 bytes each) that mint client tokens at POST /v1/client_tokens")
	fs.DurationVar(&a.TokenTTL, "auth-token-ttl", auth.DefaultTokenTTL, "lifetime of a client token")
}

// Log is shared by every server subcommand: logging and profiling.
type Log struct {
	Format string `yaml:"log_format"`
	Level  string `yaml:"log_level"`
	Pprof  bool   `yaml:"pprof"`
}

// RegisterFlags adds -log-format (default defFormat), -log-level and
// -pprof to fs, writing into l. pprofWhere names the address that serves
// the profiles, for -h.
func (l *Log) RegisterFlags(fs *flag.FlagSet, defFormat, pprofWhere string) {
	fs.StringVar(&l.Format, "log-format", defFormat, "log format: json or text")
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
	fs.BoolVar(&l.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on "+pprofWhere+" (keep it off public networks)")
}

// clusterVar adds -cluster, a cluster id of 1-65535 (default 1), writing
// into dst.
func clusterVar(fs *flag.FlagSet, dst *uint16) {
	*dst = 1
	fs.Func("cluster", "cluster id carried in tokens (1-65535, default 1)", func(s string) error {
		var v uint
		if _, err := fmt.Sscan(s, &v); err != nil || v == 0 || v > 65535 {
			return fmt.Errorf("want a number from 1 to 65535")
		}
		*dst = uint16(v)
		return nil
	})
}
