package authority

import (
	"bytes"
	"crypto/x509"
	"sync"
	"sync/atomic"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// clientAnchors is the short path of the client-certificate check that
// authorize makes (certificates are checked by authorize, not by
// crypto/tls in the handshake, so an expired or foreign one is refused
// with a reason; a connection keeps the check for its calls while it
// holds, connchain.go).
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
//
// A client may also present its leaf alone: the API listener names this
// authority's client intermediates in its CertificateRequest (serverTLS),
// and an agent or operator whose leaf one of them issued then leaves the
// intermediate out, so the authority does not keep a parsed copy of its own
// certificate for every connection (docs/performance.md). The short path
// takes the anchor whose subject is the leaf's issuer, and the signature
// decides; the full check completes the chain from issuers, so a refused
// agent or operator leaf gets the reason it would get presented with its
// intermediate. (A leaf of another of this authority's intermediates —
// a listener's — presented alone is refused as not issued by this
// authority rather than as not valid for client use: refused either way.)
//
// Intermediates rotate (DESIGN.md "CA lifecycle"): the anchors are built
// from every agent and admin intermediate accepted now (ca.Accepted), and
// built again when the hierarchy's set of intermediates changes.
type clientAnchors struct {
	mu sync.Mutex
	st atomic.Pointer[anchorSet]
}

// anchorSet is the short path built from one set of intermediates.
type anchorSet struct {
	from    *ca.Intermediates // what it was built from (nil: the files')
	anchors []anchor          // none: no short path
	root    *x509.Certificate
	// issuers holds this authority's accepted agent and admin
	// intermediates: the names the API listener advertises, and the
	// intermediates the full check completes a leaf presented alone with.
	issuers *x509.CertPool
}

// clientRoles are the intermediates that issue client certificates.
var clientRoles = []ca.Role{ca.RoleAgent, ca.RoleAdmin}

// anchor is one intermediate and a pool holding it alone.
type anchor struct {
	cert *x509.Certificate
	pool *x509.CertPool
}

// init builds the pool from the agent and admin intermediates that verify
// under the root — only when the root adds no constraint of its own that
// the full check would apply to the leaf (name constraints, extended key
// usages), which a root made by ca.Create never does.
func buildAnchors(h *ca.Hierarchy, from *ca.Intermediates) *anchorSet {
	a := &anchorSet{from: from, issuers: x509.NewCertPool()}
	for _, role := range clientRoles {
		for _, c := range h.Accepted(role) {
			a.issuers.AddCert(c)
		}
	}
	root := h.Root
	if root == nil || len(root.ExtKeyUsage) > 0 || len(root.UnknownExtKeyUsage) > 0 || hasNameConstraints(root) {
		return a
	}
	for _, role := range clientRoles {
		// Active first: successive intermediates of a role share their
		// subject, and the short path takes the first whose subject a
		// leaf presented alone names.
		for _, c := range h.Accepted(role) {
			if _, err := c.Verify(x509.VerifyOptions{Roots: h.RootPool(), CurrentTime: c.NotBefore.Add(time.Second),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				continue
			}
			pool := x509.NewCertPool()
			pool.AddCert(c)
			a.anchors = append(a.anchors, anchor{cert: c, pool: pool})
		}
	}
	a.root = root
	return a
}

// set returns the anchors of h's current intermediates, building them on
// the first call after a change.
func (a *clientAnchors) set(h *ca.Hierarchy) *anchorSet {
	cur := h.CurrentIntermediates()
	if st := a.st.Load(); st != nil && st.from == cur {
		return st
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if st := a.st.Load(); st != nil && st.from == cur {
		return st
	}
	st := buildAnchors(h, cur)
	a.st.Store(st)
	return st
}

func hasNameConstraints(c *x509.Certificate) bool {
	return c.PermittedDNSDomainsCritical || len(c.PermittedDNSDomains) > 0 || len(c.ExcludedDNSDomains) > 0 ||
		len(c.PermittedIPRanges) > 0 || len(c.ExcludedIPRanges) > 0 || len(c.PermittedEmailAddresses) > 0 ||
		len(c.ExcludedEmailAddresses) > 0 || len(c.PermittedURIDomains) > 0 || len(c.ExcludedURIDomains) > 0
}

// clientIssuers returns the pool of this authority's client intermediates.
func (a *clientAnchors) clientIssuers(h *ca.Hierarchy) *x509.CertPool {
	return a.set(h).issuers
}

// intermediates returns the pool the full check chains certs[0] through:
// what the client presented after its leaf, or, for a leaf presented
// alone, this authority's client intermediates.
func (a *clientAnchors) intermediates(h *ca.Hierarchy, certs []*x509.Certificate) *x509.CertPool {
	if len(certs) == 1 {
		return a.clientIssuers(h)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	return inter
}

// verify returns the verified chain (leaf, intermediate) and true when the
// short path applies and accepts certs; false sends the caller to the full
// check.
func (c *clientAnchors) verify(h *ca.Hierarchy, certs []*x509.Certificate, now time.Time) ([]*x509.Certificate, bool) {
	a := c.set(h)
	if len(a.anchors) == 0 || len(certs) == 0 || len(certs) > 2 || now.Before(a.root.NotBefore) || now.After(a.root.NotAfter) {
		return nil, false
	}
	var pool *x509.CertPool
	for _, an := range a.anchors {
		// Presented alone, the leaf names its issuer; presented with an
		// intermediate, that must be one of ours byte for byte.
		if len(certs) == 1 && bytes.Equal(certs[0].RawIssuer, an.cert.RawSubject) ||
			len(certs) == 2 && bytes.Equal(certs[1].Raw, an.cert.Raw) {
			pool = an.pool
			break
		}
	}
	if pool == nil {
		return nil, false
	}
	// The intermediate alone is the anchor: the full check can chain only
	// through what was presented, or, for a leaf alone, through the
	// intermediates this pool is one of.
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, false
	}
	return chains[0], true
}
