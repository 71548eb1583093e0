//go:build pkcs11 && cgo

package authority

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/custody/softhsmtest"
	"github.com/muster-dev/muster/internal/store"
)

// TestRetiredIntermediateLeavesTheToken: with PKCS#11 custody, retiring an
// intermediate deletes its key from the token (SoftHSM2): the object the
// store named no longer opens, while the active one's still does.
func TestRetiredIntermediateLeavesTheToken(t *testing.T) {
	tok := softhsmtest.Start(t)
	tk, err := custody.OpenPKCS11(custody.PKCS11Config{URI: tok.URI, Module: tok.Module, PINFile: tok.PINFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tk.Close() })
	// New keys go to the token, as with --custody pkcs11: (the test's
	// intermediates are made through it).
	a := startReplicas(t, nil, 1, noCAClock, func(c *Config) {
		c.CAIntermediateTTL = 3 * time.Minute
		c.WrapCACustody = func(sealed custody.Custody) (custody.Custody, error) {
			inToken, err := CACustody(c.StorageKey, tk)
			return importSealed{Custody: inToken, sealed: sealed.(custody.Importer)}, err
		}
	})
	s := a.srvs[0]
	ctx := t.Context()
	now := time.Now()
	expired := storeIntermediate(t, ctx, a, now.Add(-10*time.Minute), 5*time.Minute)
	current := storeIntermediate(t, ctx, a, now.Add(-10*time.Second), 3*time.Minute)
	if !custody.IsPKCS11Ref(expired.KeyRef) {
		t.Fatalf("the test's intermediate key is not in the token: %q", expired.KeyRef)
	}
	if err := s.caStepAt(ctx, now); err != nil {
		t.Fatal(err)
	}
	tokenCA := tk.For("muster-ca/")
	open := func(r store.CACert) error {
		cert, err := x509.ParseCertificate(r.CertDER)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tokenCA.Signer(ctx, keyName(r.Role, r.Serial), custody.Key{Public: cert.PublicKey, Ref: r.KeyRef})
		return err
	}
	if err := open(expired); err == nil {
		t.Fatal("the retired intermediate's key still opens in the token")
	} else if errors.Is(err, custody.ErrNoToken) {
		t.Fatal(err)
	}
	if err := open(current); err != nil {
		t.Fatalf("the active intermediate's key: %v", err)
	}
}

// importSealed makes new keys in the token but imports the data
// directory's intermediates sealed, as an authority moved to a token
// keeps its sealed keys.
type importSealed struct {
	custody.Custody
	sealed custody.Importer
}

func (c importSealed) Import(ctx context.Context, name string, key crypto.Signer) (custody.Key, error) {
	return c.sealed.Import(ctx, name, key)
}
