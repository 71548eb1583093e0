package agent

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// takeBundle takes the trust bundle an answer of the authority carried
// (nil: none) by trustbundle.Take's rule (planBundle) and writes what it
// decided (writeBundle). It returns the roots trusted now. The directory
// is locked.
func (a *Agent) takeBundle(st *State, id *identity.Identity, pb *musterv1.TrustBundle) ([]*x509.Certificate, error) {
	p := a.planBundle(st, id, pb)
	if err := a.writeBundle(st, id, p); err != nil {
		return nil, err
	}
	return p.roots, nil
}

// bundlePlan is an offered trust bundle decided on and not yet written:
// an answer that carries a certificate writes its bundle only once that
// certificate verified against the roots the plan trusts.
type bundlePlan struct {
	// roots are the roots trusted after the offer.
	roots []*x509.Certificate
	// taken is nil when nothing is to be written (no offer, or one
	// ignored).
	taken  *trustbundle.Taken
	digest string
}

// planBundle decides, by trustbundle.Take's rule, what the agent holds
// after an offer (nil: none): id.Roots are the roots trusted now, id.Chain
// the current certificate. It writes nothing. A bundle that does not
// parse or names another authority is logged and ignored: the agent keeps
// what it holds.
func (a *Agent) planBundle(st *State, id *identity.Identity, pb *musterv1.TrustBundle) bundlePlan {
	if pb == nil {
		return bundlePlan{roots: id.Roots}
	}
	offer, err := trustbundle.ParseDER(pb.GetAuthorityId(), pb.GetRoots(), pb.GetIntermediates(), pb.GetCrossCertificates())
	if err != nil {
		a.log.Warn("trust bundle not taken", "err", err)
		return bundlePlan{roots: id.Roots}
	}
	held := trustbundle.Set{AuthorityID: st.AuthorityID, Roots: id.Roots}
	t, err := trustbundle.Take(held, id.Chain, offer, a.now())
	if err != nil {
		a.log.Warn("trust bundle not taken", "err", err)
		return bundlePlan{roots: id.Roots}
	}
	return bundlePlan{roots: t.Set.Roots, taken: &t, digest: offer.Digest()}
}

// writeBundle writes what p decided: certs/ca.crt (the roots trusted
// after it), certs/bundle.pem (those roots, then the intermediates and
// cross-certificates that chain to them) and, when the roots file
// changed, the keystore of id, whose chain ends at them; each file only
// when its content changes, all or none (writeFiles). It records the
// offer's digest in st (written by the caller). The directory is locked.
func (a *Agent) writeBundle(st *State, id *identity.Identity, p bundlePlan) error {
	t := p.taken
	if t == nil {
		return nil
	}
	for _, r := range t.Refused {
		a.log.Warn("trust bundle: a certificate not taken", "reason", r)
	}
	var rootsPEM, bundlePEM []byte
	for _, c := range t.Set.Roots {
		rootsPEM = append(rootsPEM, ca.EncodeCertPEM(c)...)
	}
	bundlePEM = append(bundlePEM, rootsPEM...)
	for _, c := range append(append([]*x509.Certificate{}, t.Set.Intermediates...), t.Set.Cross...) {
		bundlePEM = append(bundlePEM, ca.EncodeCertPEM(c)...)
	}
	var files []file
	rootsChanged := false
	if old, err := readSmall(a.dir.CAFile()); err != nil || !bytes.Equal(old, rootsPEM) {
		files = append(files, file{a.dir.CAFile(), rootsPEM, 0o644})
		rootsChanged = true
	}
	if old, err := readSmall(a.dir.BundleFile()); err != nil || !bytes.Equal(old, bundlePEM) {
		files = append(files, file{a.dir.BundleFile(), bundlePEM, 0o644})
	}
	if rootsChanged && id.Key != nil {
		p12, err := a.dir.keystoreWith(id, t.Set.Roots)
		if err != nil {
			return err
		}
		files = append(files, p12...)
	}
	if len(files) > 0 {
		if err := a.dir.ensure(); err != nil {
			return err
		}
		if err := writeFiles(files...); err != nil {
			return err
		}
	}
	if p.digest != st.TrustBundle || rootsChanged {
		a.log.Info("trust bundle taken", "digest", p.digest, "roots", len(t.Set.Roots), "intermediates", len(t.Set.Intermediates),
			"cross_certificates", len(t.Set.Cross), "new_roots", len(t.NewRoots), "dropped_roots", len(t.DroppedRoots))
	}
	st.TrustBundle = p.digest
	return nil
}

// keystoreWith is the keystore of id with its chain ending at roots,
// under the password it has.
func (d Dir) keystoreWith(id *identity.Identity, roots []*x509.Certificate) ([]file, error) {
	pass, err := d.keystorePassword(false)
	if err != nil {
		return nil, err
	}
	p12, err := pkcs12.Modern.Encode(id.Key, id.Leaf(), append(append([]*x509.Certificate{}, id.Chain[1:]...), roots...), pass)
	if err != nil {
		return nil, fmt.Errorf("agent: building the keystore: %w", err)
	}
	return []file{{d.PKCS12PasswordFile(), []byte(pass), 0o600}, {d.PKCS12File(), p12, 0o600}}, nil
}

// heldBundle is what certs/bundle.pem holds, as the fingerprints a
// heartbeat reports; none without the file.
func (d Dir) heldBundle() ([]string, error) {
	data, err := readSmall(d.BundleFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	certs, err := ca.ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", d.BundleFile(), err)
	}
	var out []string
	for _, c := range certs {
		if len(out) == trustbundle.MaxCerts {
			break
		}
		out = append(out, trustbundle.CertFingerprint(c))
	}
	return out, nil
}
