// CoreDNS for the real node's cluster DNS, with only the plugins its Corefile uses
// (tests/cluster/realnode_dns.py). CoreDNS documents this way of choosing plugins at
// compile time: a main package that imports coremain and the wanted plugins, instead of
// core/plugin, which imports all of them (cloud DNS back ends and their SDKs included)
// and is most of the cold build's time. The order in which plugins run is still CoreDNS's
// own (core/dnsserver/zdirectives.go); a plugin is only available if imported here.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
