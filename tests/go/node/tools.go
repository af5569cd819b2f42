//go:build tools

// Package tools pins the kubelet the real-node tier runs. Nothing here is
// compiled into a binary of ours: `go build k8s.io/kubernetes/cmd/kubelet`
// in this module produces the upstream kubelet at the pinned version.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
