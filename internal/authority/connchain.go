package authority

import (
	"crypto/x509"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
)

// connChain is one connection's client-certificate check, kept so that
// the calls on the connection do not verify the same chain again
// (docs/threat-model.md "Client certificates, once per connection").
//
// The certificates a client presents are fixed for its connection (the
// handshake took them), so what verifying them answers can change only
// with what they are verified against — the accepted intermediates and the
// trusted roots — or with the time. A verified chain is kept with the
// intermediates and roots in use when the check began (the hierarchy sets
// new values on every change: a rotation step, a retirement, a root
// rotation's phase) and the span in which every certificate it checked is
// valid; a call that finds either changed, or now outside the span,
// verifies again, exactly as before. A refused check is not kept: each
// call gets its reason.
//
// What is not about the certificate is still checked on every call:
// whether its intermediate is one the caller's role accepts now
// (requireRole), the locks, the node and the instance's standing.
//
// It is made by the handshake (sharedCreds, whose connClass check is its
// first) and reaches the calls in the connection's AuthInfo (connAuthInfo).
type connChain struct {
	p atomic.Pointer[verifiedChain]
}

// verifiedChain is a chain verified against inter and roots, valid for
// any time in [notBefore, notAfter]. Never changed once kept: the calls
// of a connection share it (they only read the chain).
type verifiedChain struct {
	chain               []*x509.Certificate
	inter               *ca.Intermediates
	roots               *ca.RootSet
	notBefore, notAfter time.Time
}

// connAuthInfo is a connection's TLS AuthInfo with its connChain.
type connAuthInfo struct {
	credentials.TLSInfo
	chain *connChain
}

// verifyConnCerts is verifyClientCerts through cc, the connection's kept
// check (nil: none, verify).
func (s *Server) verifyConnCerts(cc *connChain, certs []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	// Read before verifying: a change made meanwhile leaves the chain
	// kept under the older values, which the next call finds stale.
	inter, roots := s.ca.CurrentIntermediates(), s.ca.CurrentRoots()
	if cc != nil {
		if v := cc.p.Load(); v != nil && v.inter == inter && v.roots == roots &&
			!now.Before(v.notBefore) && !now.After(v.notAfter) {
			return v.chain, nil
		}
	}
	chain, err := s.verifyClientCertsAt(certs, now)
	if err != nil || cc == nil {
		return chain, err
	}
	v := &verifiedChain{chain: chain, inter: inter, roots: roots}
	span := chain
	if len(chain) == 2 {
		// clientAnchors' short path, which stops at the intermediate,
		// checked the data directory's root's dates too.
		span = append([]*x509.Certificate{s.ca.Root}, chain...)
	}
	v.notBefore, v.notAfter = chain[0].NotBefore, chain[0].NotAfter
	for _, c := range span {
		if c == nil {
			continue
		}
		if c.NotBefore.After(v.notBefore) {
			v.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(v.notAfter) {
			v.notAfter = c.NotAfter
		}
	}
	cc.p.Store(v)
	return chain, nil
}
