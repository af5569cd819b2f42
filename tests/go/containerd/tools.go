//go:build tools

// Package tools pins containerd (daemon, runc shim, ctr) for the real-node
// tier, in a module of its own so that containerd's dependencies never move
// the versions the Kubernetes modules build with. Nothing here is compiled
// into a binary of ours.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
