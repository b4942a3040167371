package main

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/switchboard-rtc/switchboard/internal/config"
	"github.com/switchboard-rtc/switchboard/internal/director"
)

func runDirector(ctx context.Context, args []string, _ io.Writer) error {
	var cfg config.Director
	if err := config.Parse(cfg.Flags(), args, &cfg); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	if len(cfg.Director.Regions) == 0 && len(cfg.Director.Clusters) == 0 {
		return errors.New("no regions and clusters: they come only from a YAML file; give it with -config (or SWITCHBOARD_CONFIG), as in docs/director.md")
	}
	d, err := director.New(cfg.Director, log)
	if err != nil {
		return err
	}
	reg := newRegistry()
	mux := http.NewServeMux()
	handleOps(mux, reg, cfg.Log.Pprof)
	mux.Handle("/", d.Handler())
	return serveHTTP(ctx, "-listen", cfg.Listen, mux, signalingLimits(cfg.Director.TrustedProxies), reg, log)
}
