// Command etcd is the etcd server of go.etcd.io/etcd/server/v3, built at the
// release pinned in ../versions.env.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
