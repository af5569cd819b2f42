//go:build tools

// Package tools pins the upstream Kubernetes and etcd commands that the test
// tiers build from the Go module proxy. Nothing here is compiled into a binary
// of ours; `go build` of the listed packages produces the real components.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
