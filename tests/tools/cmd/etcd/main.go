// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the version pinned in
// go.mod, because the machine's packaged etcd is older than Kubernetes 1.34 supports.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
