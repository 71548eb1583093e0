package authority

import (
	"crypto/x509"
	"strings"
	"sync/atomic"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// bundleCache is the trust bundle every answer carries, built once per CA
// change (intermediates.load) and read without a store read per renewal.
type bundleCache struct {
	p atomic.Pointer[builtBundle]
}

type builtBundle struct {
	set trustbundle.Set
	pb  *musterv1.TrustBundle
	// digest is set.Digest().
	digest string
	// expires is set.Expires(): after it, the bundle holds an expired
	// certificate and is not served as it is (trustBundle).
	expires time.Time
}

// buildTrustBundle is the one place the trust bundle is made (DESIGN.md
// "CA lifecycle": roots, intermediates in every non-retired state,
// cross-certificates, authority ID): the trusted roots of ca.Roots (the
// data directory's, and a root rotation's from the store) with the
// rotation's cross-certificates, and every intermediate of rows
// (ListCACerts) that is not retired and is signed by a trusted root
// (load checked each is one of the authority's roots'). Nil rows (a server whose store was not read yet) stand
// for the data directory's intermediates.
func (s *Server) buildTrustBundle(rows []store.CACert) *builtBundle {
	// The trusted roots (the signing one first) and, during a root
	// rotation, its cross-certificates, through which agents take the
	// other root (rootrotate.go).
	rs := s.ca.Roots()
	set := trustbundle.Set{AuthorityID: s.info.AuthorityID, Roots: rs.Trusted}
	// Only what a trusted root signed: from standby on, the old root's
	// intermediates stay retiring in the store (a rollback trusts them
	// again) and its cross-certificate stays in the rotation record, but
	// no agent may take them (trustbundle.Take refuses each, logging a
	// warning at every renewal and stream open for as long as they are
	// offered, up to a year for the admin intermediate).
	for _, c := range rs.Cross {
		if signedByOneOf(c, set.Roots) {
			set.Cross = append(set.Cross, c)
		}
	}
	if rows == nil {
		for _, role := range caRoles {
			if i := s.ca.Issuers[role]; i != nil {
				set.Intermediates = append(set.Intermediates, i.Cert)
			}
		}
	}
	for _, r := range rows {
		if r.State == store.CARetired {
			continue
		}
		c, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			continue // load refused the whole read already
		}
		if !signedByOneOf(c, set.Roots) {
			continue // a root no longer trusted's (above)
		}
		set.Intermediates = append(set.Intermediates, c)
	}
	return newBuiltBundle(set.Unexpired(s.now()))
}

// newBuiltBundle is set as answers carry it.
func newBuiltBundle(set trustbundle.Set) *builtBundle {
	pb := &musterv1.TrustBundle{AuthorityId: set.AuthorityID, Digest: set.Digest()}
	for _, c := range set.Roots {
		pb.Roots = append(pb.Roots, c.Raw)
	}
	for _, c := range set.Intermediates {
		pb.Intermediates = append(pb.Intermediates, c.Raw)
	}
	for _, c := range set.Cross {
		pb.CrossCertificates = append(pb.CrossCertificates, c.Raw)
	}
	return &builtBundle{set: set, pb: pb, digest: pb.Digest, expires: set.Expires()}
}

// setTrustBundle caches b and, when it differs from the one before, wakes
// every open agent stream to send it.
func (s *Server) setTrustBundle(b *builtBundle) {
	s.announceBundle(s.bundle.p.Swap(b), b)
}

// announceBundle logs b and wakes every open agent stream to send it, if
// it differs from old, the bundle it replaced (nil: none).
func (s *Server) announceBundle(old, b *builtBundle) {
	if old == nil || old.digest != b.digest {
		s.log.Info("trust bundle changed", "digest", b.digest, "roots", len(b.set.Roots),
			"intermediates", len(b.set.Intermediates), "cross_certificates", len(b.set.Cross))
		s.hub.notify(store.Change{Kind: store.ChangeCA})
	}
}

// trustBundle is the current trust bundle (the data directory's until the
// store was read). Answers share it: nobody may modify it. It never holds
// a certificate expired by the replica's clock: the CA clock retires an
// expired intermediate only at its next step, seconds later, and the
// store is read again after that, so a cached bundle past its earliest
// expiry is replaced here, at the first answer that would carry it, and
// open streams are sent the new one.
func (s *Server) trustBundle() *builtBundle {
	b := s.bundle.p.Load()
	if b == nil {
		return s.buildTrustBundle(nil)
	}
	now := s.now()
	if b.expires.IsZero() || !now.After(b.expires) {
		return b
	}
	nb := newBuiltBundle(b.set.Unexpired(now))
	if s.bundle.p.CompareAndSwap(b, nb) {
		s.announceBundle(b, nb)
	}
	// Lost to another update: nb is still right for this answer, and the
	// winner's bundle is checked the same way at the next one.
	return nb
}

// now is the replica's clock (Config.Clock).
func (s *Server) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}

// trustBundleProto is the current bundle as answers carry it.
func (s *Server) trustBundleProto() *musterv1.TrustBundle { return s.trustBundle().pb }

// validDigest reports whether d is "sha256:" and 64 lower-case hex
// digits, as a heartbeat names a bundle or a certificate.
func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
