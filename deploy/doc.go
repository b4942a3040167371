// Package deploy holds what runs Switchboard on Kubernetes: the Helm chart
// in deploy/switchboard and the Grafana dashboard in deploy/grafana. It has
// no Go code of its own; its tests render the chart, validate the
// manifests offline against the Kubernetes API types, and check that
// ports, flag names, key names and ids agree between the chart, the
// switchboard binary's flags and the code (docs/operations.md).
package deploy
