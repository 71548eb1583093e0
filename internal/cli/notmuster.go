package cli

import "fmt"

// notMuster explains gRPC's "unknown service" answer: the address given
// is a gRPC server, but not the muster server the command wanted (an
// agent pointed at the discovery service, an admin command at the
// authority's bootstrap-only listener).
func notMuster(service string) string {
	var what string
	switch service {
	case "muster.v1.DiscoveryService":
		what = "is not a muster discovery service"
	case "muster.v1.BootstrapService":
		what = "is not a muster authority"
	default:
		what = "is not a muster authority's API address (a bootstrap-only listener, a discovery service, or another server?)"
	}
	return fmt.Sprintf("UNIMPLEMENTED: the server at that address %s: it does not serve %s; check the address", what, service)
}
