//go:build tools

// Package tools pins the Helm CLI that the chart tests use (render, lint).
// Nothing of ours is compiled: scripts/build-helm.sh builds
// helm.sh/helm/v4/cmd/helm from the versions pinned in this go.mod/go.sum.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
