package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/crl"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// TestOfflineAdminSignsWithStoreIntermediate: break-glass signs with the
// store's active admin intermediate once there is one (after a rotation
// the data directory's is retiring or gone), and with the data
// directory's only while the store has none.
func TestOfflineAdminSignsWithStoreIntermediate(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	res, err := datadir.Init(ctx, datadir.InitOptions{Dir: datadir.Dir(filepath.Join(t.TempDir(), "data")), Name: "test", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	dir := res.Dir
	d, err := loadDataDir(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	fileCert := d.ca.Issuers[ca.RoleAdmin].Cert

	// No active admin row in the store: the data directory's signs.
	op, err := addOperatorOffline(ctx, offlineDir{dir: dir}, "", "", "alice", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Identity.Leaf().CheckSignatureFrom(fileCert); err != nil {
		t.Fatalf("without a store intermediate: not signed by the data directory's admin intermediate: %v", err)
	}

	// A successor made as the authority makes one: key sealed through
	// custody, certificate from the root, active in the store.
	serial, err := ca.NewSerial()
	if err != nil {
		t.Fatal(err)
	}
	c, err := custody.NewSealedCA(d.sk)
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.Create(ctx, "admin/"+serial.Text(16), custody.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	next, err := d.ca.NewIntermediate(ca.RoleAdmin, serial, k.Public, d.ca.RootKey, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openStore(ctx, d.url)
	if err != nil {
		t.Fatal(err)
	}
	err = st.InsertCACert(ctx, store.CACert{Role: string(ca.RoleAdmin), Serial: serial.Text(16), CertDER: next.Raw, KeyRef: k.Ref, State: store.CAActive, NotAfter: next.NotAfter}, setupLink)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}

	op, err = addOperatorOffline(ctx, offlineDir{dir: dir}, "", "https://crl.example/crl", "alice", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf := op.Identity.Leaf()
	if err := leaf.CheckSignatureFrom(next); err != nil {
		t.Fatalf("not signed by the store's active admin intermediate: %v", err)
	}
	if !bytes.Equal(leaf.AuthorityKeyId, next.SubjectKeyId) || !op.Identity.Chain[1].Equal(next) {
		t.Errorf("chain names %x / %s, want the store's intermediate %s", leaf.AuthorityKeyId, op.Identity.Chain[1].SerialNumber.Text(16), serial.Text(16))
	}
	inter := x509.NewCertPool()
	inter.AddCert(next)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: d.ca.RootPool(), Intermediates: inter, CurrentTime: now.Add(time.Minute),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("does not verify to the root through the store's intermediate: %v", err)
	}
	want := crl.DistributionPoint("https://crl.example/crl", crl.Issuer{Role: string(ca.RoleAdmin), Cert: next})
	if len(leaf.CRLDistributionPoints) != 1 || leaf.CRLDistributionPoints[0] != want {
		t.Errorf("CRL distribution points %v, want [%s] (the store's intermediate's list)", leaf.CRLDistributionPoints, want)
	}
}
