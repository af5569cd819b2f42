//go:build tools

// Package tools pins the CNI plugins the real-node tier's containerd uses
// (bridge and host-local: this machine's kernel has veth and bridge links but
// no dummy, macvlan or ipvlan), in a module of its own.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
)
