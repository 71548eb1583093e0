package ca

import (
	"crypto/x509"
	"sync/atomic"
)

// Intermediates is the set of intermediates the authority uses now, as the
// store holds them (DESIGN.md "CA lifecycle"): the active one of each
// role, which signs every new leaf, and every one of the role still in the
// trust bundle (prepared, active, retiring), active first.
type Intermediates struct {
	Active map[Role]*Issuer
	Bundle map[Role][]*x509.Certificate
	// Retiring are the intermediates that sign no new leaf but whose
	// leaves may still be valid, with their keys: each still signs its
	// certificate revocation list until it is retired.
	Retiring map[Role][]*Issuer
	// Prepared are the successors in the bundle that sign no leaf yet,
	// with their keys: each signs its (empty) revocation list from the
	// start, so the first leaf it signs once active never names a list
	// that is not served.
	Prepared map[Role][]*Issuer
	// Distrusted are the intermediates still retiring in the store under
	// a root no longer trusted (a root rotation's old root, from standby
	// on): they sign nothing and their leaves are refused; a refusal of
	// one of their leaves says why and what to do.
	Distrusted []*x509.Certificate
	// DistrustedRetiring are those of Distrusted still retiring, with
	// their keys (nil if lost): a relying party that still trusts the
	// old root may hold their leaves, so each still signs its revocation
	// list until it is retired.
	DistrustedRetiring map[Role][]*Issuer
	// Restorable are those of Distrusted that a rollback would trust
	// again: signed by the old root of a rotation in standby.
	Restorable []*x509.Certificate
}

// live holds the current *Intermediates of a hierarchy; nil until the
// authority has read them from its store, and then the files' issuers
// answer.
type live struct {
	p     atomic.Pointer[Intermediates]
	roots atomic.Pointer[RootSet]
}

// SetIntermediates replaces the intermediates every signer of leaves uses
// from now on. Safe for concurrent use with Issuer and Accepted.
func (h *Hierarchy) SetIntermediates(in *Intermediates) { h.live.p.Store(in) }

// CurrentIntermediates returns what SetIntermediates last set, or nil.
func (h *Hierarchy) CurrentIntermediates() *Intermediates { return h.live.p.Load() }

// Issuer returns the certificate and key that sign new leaves of role: the
// active intermediate from the store, or, before the store was read (and
// for the policy certificate, which is not rotated), the one from the data
// directory; nil if there is none. Every leaf is signed through it
// (Issuer.Issue), so what a leaf carries is decided in one place. Safe for
// concurrent use.
func (h *Hierarchy) Issuer(role Role) *Issuer {
	if in := h.live.p.Load(); in != nil {
		if i := in.Active[role]; i != nil {
			return i
		}
	}
	return h.Issuers[role]
}

// Accepted returns every intermediate of role whose leaves are accepted
// now: those in the trust bundle, or the data directory's alone before the
// store was read.
func (h *Hierarchy) Accepted(role Role) []*x509.Certificate {
	if in := h.live.p.Load(); in != nil && len(in.Bundle[role]) > 0 {
		return in.Bundle[role]
	}
	if i := h.Issuers[role]; i != nil {
		return []*x509.Certificate{i.Cert}
	}
	return nil
}
