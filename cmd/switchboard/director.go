package main

import (
	"context"
	"flag"
	"io"
	"net/http"

	"github.com/switchboard-rtc/switchboard/internal/director"
)

func runDirector(ctx context.Context, args []string, _ io.Writer) error {
	var cfg struct {
		Director director.Config `yaml:",inline"`
		Listen   string          `yaml:"listen"`
		Log      LogConfig       `yaml:",inline"`
	}
	fs := flag.NewFlagSet("director", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8443", "address serving the signaling API (/v1/calls), /metrics, /live and /ready")
	fs.StringVar(&cfg.Director.Mode, "mode", "proxy", "proxy (forward the offer) or redirect (307 to the transceiver)")
	fs.StringVar(&cfg.Director.RegionHeader, "region-header", "", "request header a trusted CDN sets to the client's region (empty: ignore)")
	fs.StringVar(&cfg.Director.DefaultRegion, "default-region", "", "region used when neither header nor client IP decides (required)")
	registerAuth(fs, &cfg.Director.Auth)
	cfg.Log.register(fs, "json")
	fs.Usage = func() {
		fs.Output().Write([]byte("Usage: switchboard director -config director.yaml [flags]\n\n" +
			"Routes each offer to a transceiver of the cluster serving the client's region.\n" +
			"Regions, their prefixes and clusters come from the YAML file (keys regions,\n" +
			"clusters, trusted_proxies; see docs/director.md).\n\nFlags:\n"))
		fs.PrintDefaults()
	}
	if err := parseConfig(fs, args, &cfg,
		yamlOnly{"regions", "region name → {cluster, prefixes}: the client IP prefixes that place a client in the region"},
		yamlOnly{"clusters", "cluster name → signaling base URLs of its transceivers, picked round-robin"},
		yamlOnly{"trusted_proxies", "CIDR prefixes of proxies whose X-Forwarded-For is believed"},
	); err != nil {
		return err
	}
	log, err := newLogger(cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	d, err := director.New(cfg.Director, log)
	if err != nil {
		return err
	}
	reg := newRegistry()
	mux := http.NewServeMux()
	handleOps(mux, reg, cfg.Log.Pprof)
	mux.Handle("/", d.Handler())
	return serveHTTP(ctx, cfg.Listen, mux, log)
}
