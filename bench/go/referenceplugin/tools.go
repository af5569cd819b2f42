//go:build tools

// Package tools pins the Go reference kubelet plugin that bench/reference_plugin.py
// runs side by side with ours. Nothing of ours is compiled:
// bench/build-reference-plugin.sh builds
// sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin from the versions
// pinned in this go.mod/go.sum (its own module, so its dependencies never move
// the Kubernetes components').
package tools

import (
	_ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
)
