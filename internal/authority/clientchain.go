package authority

import (
	"bytes"
	"crypto/x509"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// clientAnchors is the short path of the client-certificate check that
// authorize makes on every call (certificates are checked per call, not in
// the handshake, so an expired or foreign one is refused with a reason).
//
// The full check verifies two signatures: the leaf's, by the intermediate
// the client presents, and that intermediate's, by the root. Every chain
// authorize accepts must present one of this authority's own client
// intermediates (requireRole compares it byte for byte), whose signature
// by the root never changes: checking it on every call checks the same
// bytes again. So when the client presents exactly one of them, the leaf is
// verified with that intermediate as the anchor — one signature, its
// validity and key usage still checked by x509 at the current time, as is
// the leaf's. Anything else (no intermediate, another one, a certificate
// this path refuses) takes the full check, which gives the same answer and
// reasons as before.
type clientAnchors struct {
	once    sync.Once
	anchors []anchor // none: no short path
	root    *x509.Certificate
}

// anchor is one intermediate and a pool holding it alone.
type anchor struct {
	cert *x509.Certificate
	pool *x509.CertPool
}

// init builds the pool from the agent and admin intermediates that verify
// under the root — only when the root adds no constraint of its own that
// the full check would apply to the leaf (name constraints, extended key
// usages), which a root made by ca.Create never does.
func (a *clientAnchors) init(h *ca.Hierarchy) {
	root := h.Root
	if root == nil || len(root.ExtKeyUsage) > 0 || len(root.UnknownExtKeyUsage) > 0 || hasNameConstraints(root) {
		return
	}
	for _, role := range []ca.Role{ca.RoleAgent, ca.RoleAdmin} {
		is := h.Issuer(role)
		if is == nil {
			continue
		}
		if _, err := is.Cert.Verify(x509.VerifyOptions{Roots: h.RootPool(), CurrentTime: is.Cert.NotBefore.Add(time.Second),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			continue
		}
		pool := x509.NewCertPool()
		pool.AddCert(is.Cert)
		a.anchors = append(a.anchors, anchor{cert: is.Cert, pool: pool})
	}
	a.root = root
}

func hasNameConstraints(c *x509.Certificate) bool {
	return c.PermittedDNSDomainsCritical || len(c.PermittedDNSDomains) > 0 || len(c.ExcludedDNSDomains) > 0 ||
		len(c.PermittedIPRanges) > 0 || len(c.ExcludedIPRanges) > 0 || len(c.PermittedEmailAddresses) > 0 ||
		len(c.ExcludedEmailAddresses) > 0 || len(c.PermittedURIDomains) > 0 || len(c.ExcludedURIDomains) > 0
}

// verify returns the verified chain (leaf, intermediate) and true when the
// short path applies and accepts certs; false sends the caller to the full
// check.
func (a *clientAnchors) verify(h *ca.Hierarchy, certs []*x509.Certificate, now time.Time) ([]*x509.Certificate, bool) {
	a.once.Do(func() { a.init(h) })
	if len(a.anchors) == 0 || len(certs) != 2 || now.Before(a.root.NotBefore) || now.After(a.root.NotAfter) {
		return nil, false
	}
	var pool *x509.CertPool
	for _, an := range a.anchors {
		if bytes.Equal(certs[1].Raw, an.cert.Raw) {
			pool = an.pool
		}
	}
	if pool == nil {
		return nil, false
	}
	// The presented intermediate alone is the anchor, as the full check
	// can chain only through what was presented.
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, false
	}
	return chains[0], true
}
