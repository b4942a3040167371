// Package kube runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver and kube-controller-manager, built from the pinned
// modules of internal/testsupport/kube/build by scripts/kube-build.sh
// (the module proxy is the only download), started on loopback (or inside
// a network namespace the test creates) and stopped when the test ends.
//
// There is no kubelet. What a kubelet would do for a pod the tests do
// through the API, the way a kubelet does it: bind it to a Node (the
// binding subresource), report it running with an IP and a Ready
// condition (the status subresource), resolve its container's
// environment (values, the downward API, Secrets and ConfigMaps) and
// materialize its ConfigMap volumes, so that the real switchboard binary
// can run as that pod on the host. Everything else is the real
// Kubernetes: API validation and defaulting, RBAC, the StatefulSet,
// Deployment and EndpointSlice controllers, watches across an API server
// restart.
//
// The controllers started are those the chart's objects need (see
// Controllers); the node lifecycle controller is not, so Nodes created by
// a test are never tainted or evicted for lack of a kubelet.
package kube
