package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchboard-rtc/switchboard/internal/config"
)

func TestRelayMembership(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	badKubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(badKubeconfig, []byte("not: [a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		m       config.Membership
		static  string
		wantErr string
		want    int
	}{
		{"static", config.Membership{Source: "static"}, "1=127.0.0.1:4000,2=127.0.0.1:4001", "", 2},
		{"default is static", config.Membership{}, "1=127.0.0.1:4000", "", 1},
		{"static empty", config.Membership{Source: "static"}, "", "-members is empty", 0},
		{"static invalid", config.Membership{Source: "static"}, "1=localhost:4000", "-members: membership: invalid entry", 0},
		{"unknown source", config.Membership{Source: "etcd"}, "", `-membership "etcd": want static, kubernetes or redis`, 0},
		{"redis without address", config.Membership{Source: "redis"}, "", "-membership redis needs -redis", 0},
		{"kubernetes with members", config.Membership{Source: "kubernetes"}, "1=127.0.0.1:4000", "exclude each other", 0},
		{"kubernetes bad kubeconfig", config.Membership{Source: "kubernetes", Namespace: "ns", Service: "s", Kubeconfig: badKubeconfig}, "", "-membership kubernetes:", 0},
		{"kubernetes outside a cluster", config.Membership{Source: "kubernetes", Namespace: "ns", Service: "s"}, "", "-membership kubernetes:", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			reg := prometheus.NewRegistry()
			tab, stop, err := relayMembership(t.Context(), tt.m, tt.static, 1, reg, log)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			if tab.Len() != tt.want {
				t.Fatalf("%d members, want %d", tab.Len(), tt.want)
			}
			want := fmt.Sprintf("# HELP switchboard_relay_members Transceivers in the relay's membership table.\n# TYPE switchboard_relay_members gauge\nswitchboard_relay_members{source=\"static\"} %d\n", tt.want)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "switchboard_relay_members"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
