package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/authority"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// offlineActor is the audit actor of a break-glass operator identity: no
// operator certificate vouches for it, the storage key does.
const offlineActor = "muster admin add --offline"

// offlineOperator is what addOperatorOffline issued.
type offlineOperator struct {
	ID       spiffeid.ID
	Identity *identity.Identity
}

// addOperatorOffline is the break-glass path (DESIGN.md, "Operator
// identities"): with no operator identity left that the authority accepts,
// whoever holds the data directory (its root certificate and its storage
// key, which opens the key of the store's active admin intermediate) signs
// a new one without the API, records it in the store and appends its
// audit record to the chain, keyed by the storage key as the authority's
// own records are. A running authority on the same
// directory or store is left alone: every write here is the store's own
// conditional write, as from any replica.
// crlURL, if set (crl_url), is named in the identity's CRL Distribution
// Points as the authority names it in the ones it signs.
func addOperatorOffline(ctx context.Context, od offlineDir, storeURL, crlURL, name string, ttl time.Duration, now time.Time) (offlineOperator, error) {
	if ttl <= 0 || ttl > 366*24*time.Hour {
		return offlineOperator{}, fmt.Errorf("ttl must be between 1s and %s", 366*24*time.Hour)
	}
	dir := od.dir
	info, err := dir.ReadInfo()
	if err != nil {
		return offlineOperator{}, err
	}
	id, err := spiffeid.New(info.TrustDomain, spiffeid.RoleAdmin, name)
	if err != nil {
		return offlineOperator{}, fmt.Errorf("operator name: %w", err)
	}
	st, d, err := openOfflineStore(ctx, od, storeURL)
	if err != nil {
		return offlineOperator{}, err
	}
	defer st.Close()
	logger, err := newAuditLogger(st, d.sk, dir, od.configPath, nil)
	if err != nil {
		return offlineOperator{}, err
	}
	// A chain cut short is refused here as at the authority's start:
	// appending would reuse the removed records' numbers.
	if err := logger.CheckHead(ctx); err != nil {
		return offlineOperator{}, err
	}
	if crlURL != "" {
		if err := checkCRLURL(crlURL); err != nil {
			return offlineOperator{}, err
		}
	}
	issuer, root, err := offlineAdminIssuer(ctx, st, d, od.token)
	if err != nil {
		return offlineOperator{}, err
	}
	if crlURL != "" {
		issuer.CRLDistributionPoints = []string{crl.DistributionPoint(crlURL, crl.Issuer{Role: string(ca.RoleAdmin), Cert: issuer.Cert})}
	}
	op, err := datadir.IssueOperator(issuer, root, id, nil, ttl, now)
	if err != nil {
		return offlineOperator{}, err
	}
	rec := datadir.OperatorRecord(op, id, offlineActor, now)
	// Break-glass is for a name whose identity is lost as much as for one
	// that expired: a valid certificate of the name does not stop it.
	rec.Reissue = true
	// The certificate is recorded with its audit record, or neither is.
	link, err := logger.Builder(audit.Event{Actor: offlineActor, Action: "operator.add",
		Target: id.String(), Result: audit.ResultOK,
		Reason: fmt.Sprintf("break-glass: serial %s signed with the admin intermediate %s (storage key of %s), valid until %s",
			rec.Serial, issuer.Cert.SerialNumber.Text(16), dir, op.Leaf().NotAfter.UTC().Format(time.RFC3339))})
	if err != nil {
		return offlineOperator{}, err
	}
	if err := st.InsertOperator(ctx, rec, link.Build); err != nil {
		return offlineOperator{}, fmt.Errorf("recording the operator certificate with its audit record (neither is written): %w", err)
	}
	logger.Appended(link)
	return offlineOperator{ID: id, Identity: op}, nil
}

// offlineAdminIssuer is the intermediate a break-glass identity is signed
// with: the store's active admin intermediate (DESIGN.md "Operator
// identities"), the one the authority signs operator identities with, its
// key opened through custody as the authority opens it. Only a store with
// no active admin intermediate (an authority not started since
// intermediates moved into the store) leaves the data directory's to sign.
// The result is a copy: the caller may set its CRL distribution points.
func offlineAdminIssuer(ctx context.Context, st store.Store, d dataDir, ta tokenAccess) (*ca.Issuer, *x509.Certificate, error) {
	rows, err := st.ListCACerts(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CA certificates from the store: %w", err)
	}
	c, err := custody.NewSealedCA(d.sk)
	if err != nil {
		return nil, nil, err
	}
	tok := &offlineToken{d: d, access: ta}
	roots, err := offlineRoots(ctx, st, d, c, tok)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range rows {
		if r.Role != string(ca.RoleAdmin) || r.State != store.CAActive {
			continue
		}
		cert, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			return nil, nil, fmt.Errorf("the store's active admin intermediate %s: %w", r.Serial, err)
		}
		var root *x509.Certificate
		for _, rt := range roots {
			if cert.CheckSignatureFrom(rt) == nil {
				root = rt
				break
			}
		}
		if root == nil {
			return nil, nil, fmt.Errorf("the store's active admin intermediate %s is not signed by the root CA in the data directory nor by a root of the store's root rotation", r.Serial)
		}
		var ic custody.Custody = c
		if custody.IsPKCS11Ref(r.KeyRef) {
			if ic, err = tok.custody(); err != nil {
				return nil, nil, fmt.Errorf("the store's active admin intermediate %s is in a PKCS#11 token: %w", r.Serial, err)
			}
		}
		key, err := ic.Signer(ctx, r.Role+"/"+r.Serial, custody.Key{Public: cert.PublicKey, Ref: r.KeyRef})
		if err != nil {
			return nil, nil, fmt.Errorf("opening the key of the store's active admin intermediate %s (%s): %w", r.Serial, custody.Where(r.KeyRef), err)
		}
		return &ca.Issuer{Cert: cert, Key: key}, root, nil
	}
	file := d.ca.Issuer(ca.RoleAdmin)
	if file == nil {
		return nil, nil, errors.New("no admin intermediate in the store or in the data directory")
	}
	return &ca.Issuer{Cert: file.Cert, Key: file.Key}, d.ca.Root, nil
}

// offlineToken opens the authority's token once, as the authority opens
// it (authority.json, MUSTER_PKCS11_MODULE, MUSTER_PKCS11_PIN_FILE,
// MUSTER_PKCS11_PIN), for the keys break-glass finds
// in it (the admin intermediate, a root a rotation made in the token),
// and leaves it open until this command exits.
type offlineToken struct {
	d      dataDir
	access tokenAccess
	done   bool
	c      custody.Custody
	err    error
}

func (t *offlineToken) custody() (custody.Custody, error) {
	if !t.done {
		t.done = true
		token, err := openToken(t.d.info.Custody, t.access.module, t.access.pinFile)
		if err == nil && token == nil {
			err = custody.ErrNoToken
		}
		if err == nil {
			t.c, err = authority.CACustody(t.d.sk, token)
		}
		t.err = err
	}
	return t.c, t.err
}

// offlineRoots is the data directory's root and the roots of the store's
// root rotation (DESIGN.md "Root rotation": from update_servers on the
// admin intermediate is signed by the new root). A stored root counts only
// if its sealed key opens with the data directory's storage key, as the
// authority checks it (or in the authority's token, for a root made
// there), or, once its key was taken offline (muster ca root
// export-key), if the rotation's cross-certificate certifies its key under
// a root that counts.
func offlineRoots(ctx context.Context, st store.Store, d dataDir, c custody.Custody, tok *offlineToken) ([]*x509.Certificate, error) {
	roots := []*x509.Certificate{d.ca.Root}
	rot, err := st.GetRootRotation(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the root rotation from the store: %w", err)
	}
	type stored struct{ der, ref, cross []byte }
	var offline []stored
	for _, p := range []stored{{rot.NewCertDER, rot.NewKeyRef, rot.CrossNewByOld}, {rot.OldCertDER, rot.OldKeyRef, rot.CrossOldByNew}} {
		if p.der == nil {
			continue
		}
		if p.ref == nil {
			offline = append(offline, p)
			continue
		}
		cert, err := x509.ParseCertificate(p.der)
		if err != nil {
			return nil, fmt.Errorf("a root of the store's root rotation: %w", err)
		}
		var rc custody.Custody = c
		if custody.IsPKCS11Ref(p.ref) {
			// Made in the token (muster ca root rotate with pkcs11
			// custody): it counts if its object opens there, as the
			// authority checks it.
			if rc, err = tok.custody(); err != nil {
				return nil, fmt.Errorf("a root of the store's root rotation (%s) is in a PKCS#11 token: %w", ca.Fingerprint(cert), err)
			}
			if _, err := rc.Signer(ctx, "root/"+cert.SerialNumber.Text(16), custody.Key{Public: cert.PublicKey, Ref: p.ref}); err != nil {
				return nil, fmt.Errorf("a root of the store's root rotation (%s) does not open in the PKCS#11 token: %w", ca.Fingerprint(cert), err)
			}
		} else if _, err := rc.Signer(ctx, "root/"+cert.SerialNumber.Text(16), custody.Key{Public: cert.PublicKey, Ref: p.ref}); err != nil {
			return nil, fmt.Errorf("a root of the store's root rotation (%s) does not open with the data directory's storage key: %w", ca.Fingerprint(cert), err)
		}
		roots = append(roots, cert)
	}
	// Two passes: an offline root may be certified by the other offline one.
	for range 2 {
		for i, p := range offline {
			if p.der == nil {
				continue
			}
			cert, err1 := x509.ParseCertificate(p.der)
			cross, err2 := x509.ParseCertificate(p.cross)
			if err1 != nil || err2 != nil || !bytes.Equal(cert.RawSubjectPublicKeyInfo, cross.RawSubjectPublicKeyInfo) {
				continue
			}
			for _, r := range roots {
				if cross.CheckSignatureFrom(r) == nil {
					roots = append(roots, cert)
					offline[i].der = nil
					break
				}
			}
		}
	}
	return roots, nil
}
