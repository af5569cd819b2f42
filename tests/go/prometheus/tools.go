//go:build tools

// Package tools pins Prometheus and promtool: promtool checks and unit-tests
// the chart's alerting rules, and a real Prometheus scrapes our plugin so the
// dashboard's queries are run against what it exports. Its own module, so
// Prometheus's dependencies never move Kubernetes'. Nothing here is compiled
// into a binary of ours: scripts/build-prometheus.sh builds the two commands
// without service-discovery plugins (tag remove_all_sd; tests use static targets).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
