package discoveryd

import (
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/listener"
)

// Registration refusals of the allow-list, as the registrations metric
// counts them.
const (
	resultNotAllowed     = "not_allowed"
	resultRootNotAllowed = "root_not_allowed"
	// resultRootNotLinked: a root the bundle does not link to the root
	// the authority ID is locked to (discovery.ErrRootNotLinked).
	resultRootNotLinked = "root_not_linked"
)

// notAllowed turns the allow-list's refusal into the caller's. The
// fingerprint to allow is left for the operator to fill in from the
// authority (muster init printed it): a fingerprint echoed from the
// registration refused would be the one an impostor sent.
func notAllowed(err error) (string, error) {
	var na *discovery.NotAllowedError
	if !errors.As(err, &na) {
		return "error", err
	}
	if na.Allowed == "" {
		return resultNotAllowed, refuse(codes.PermissionDenied, resultNotAllowed,
			"authority ID %s is not allowed at this discovery: start it with --allow-authority %s=sha256:… (see muster discovery show)",
			na.AuthorityID, na.AuthorityID)
	}
	return resultRootNotAllowed, refuse(codes.PermissionDenied, resultRootNotAllowed,
		"authority ID %s is allowed at this discovery with root fingerprint %s only; this registration is signed under %s",
		na.AuthorityID, na.Allowed, na.Fingerprint)
}

// checkIssuerHost refuses to start when the ticket issuer,
// https://ADVERTISE (by default the bound listen address), would name no
// machine: an authority could never match it to the discovery it calls.
// A listen address without a host, or with 0.0.0.0 or ::, binds every
// interface and is bound as such.
func checkIssuerHost(listen, advertise string) error {
	addr, what := advertise, "the advertise address"
	if addr == "" {
		addr, what = listen, "the listen address (there is no --advertise)"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		// A malformed listen address fails to bind, with its reason.
		return nil
	}
	if listener.Unspecified(host) {
		return fmt.Errorf("discoveryd: the ticket issuer https://%s would name no machine: %s %s is unspecified; set --advertise to the HOST:PORT authorities and agents reach discovery at",
			addr, what, addr)
	}
	return nil
}
