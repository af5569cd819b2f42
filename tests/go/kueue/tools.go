//go:build tools

// Package tools pins the Kueue controller manager that the quota and gang
// admission tests run against our control plane, in a module of its own so
// Kueue's dependencies (it builds against Kubernetes 1.36 libraries) never
// move the versions the control plane is built with. Nothing here is compiled
// into a binary of ours: scripts/build-kueue.sh builds sigs.k8s.io/kueue/cmd/kueue.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
