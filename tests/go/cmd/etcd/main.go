// Command etcd runs the etcd server at the version pinned by this module's
// go.mod (the one Kubernetes itself requires), so the test control plane uses
// an etcd built from Go modules rather than an old prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
