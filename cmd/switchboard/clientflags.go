package main

import (
	"errors"
	"flag"
	"net/http"
	"strings"

	"github.com/switchboard-rtc/switchboard/internal/config"
)

// headerFlag defines the repeatable -header flag of the client commands
// (call, load): each "Name: value" is added to *h, created on first use.
// A value without a colon or with an empty name is refused with an error
// that says the expected form.
func headerFlag(fs *flag.FlagSet, h *http.Header, usage string) {
	fs.Func("header", usage, func(v string) error {
		name, value, ok := strings.Cut(v, ":")
		if name = strings.TrimSpace(name); !ok || name == "" {
			return errors.New(`want "Name: value"`)
		}
		if *h == nil {
			*h = http.Header{}
		}
		h.Add(name, strings.TrimSpace(value))
		return nil
	})
}

// parseInterspersed parses args with fs (config.ParseFlags: a bad flag is
// one line and a pointer to -h) and returns the positional arguments
// wherever they stand among the flags (the flag package stops at the
// first non-flag argument; this parses on after each one).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := config.ParseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
