package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is the release this binary was built as, set at link time
// (go build -ldflags "-X main.version=v1.2.3"; the Dockerfile's VERSION
// argument); empty, the module version or VCS revision Go recorded is
// shown instead.
var version string

// versionString returns the binary's version, the commit it was built
// from when Go recorded one (with "+modified" for a dirty tree), and the
// Go toolchain and platform: "switchboard v1.2.3 (commit 06d8c89, go1.26.8 linux/amd64)".
func versionString() string {
	v, commit := version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if len(commit) > 12 {
			commit = commit[:12]
		}
		if commit != "" && modified {
			commit += "+modified"
		}
	}
	if v == "" {
		v = "devel"
	}
	detail := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	if commit != "" {
		detail = "commit " + commit + ", " + detail
	}
	return fmt.Sprintf("switchboard %s (%s)", v, detail)
}

// runVersion is `switchboard version` (and -version): it prints
// versionString.
func runVersion(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("takes no arguments, got %q", args)
	}
	fmt.Fprintln(stdout, versionString())
	return nil
}
