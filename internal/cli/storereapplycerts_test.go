package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// testCA is a CA certificate and its key.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{c, key}
}

// issue is a carried identity of node's instance i1 at generation 2, its
// leaf signed by ca for node, valid until notAfter.
func (ca testCA) issue(t *testing.T, node string, serial int64, notAfter time.Time) store.CarriedIdentity {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := spiffeid.New("muster.test", spiffeid.RoleAgent, node)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), URIs: []*url.URL{id.URL()},
		NotBefore: notAfter.Add(-24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	spki := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	sn := leaf.SerialNumber.Text(16)
	in := store.Instance{ID: "i1", NodeID: "node-1", JoinMethod: "token", TokenID: "t1", State: store.InstanceCurrent, Generation: 2,
		LastSerial: sn, LastPublicKey: spki[:], LastChainPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	held := in
	held.Generation, held.LastSerial = 1, "01"
	return store.CarriedIdentity{Instance: in, Held: &held, Certificate: store.Certificate{Serial: sn, NodeID: "node-1", InstanceID: "i1",
		Generation: 2, JoinMethod: "token", TokenID: "t1", PublicKey: spki[:], NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter}}
}

// TestCarriedCertificatesAreOnlyThisAuthoritysOwn: reapply carries a
// certificate only when its chain's leaf is the one its record names,
// for the node it names, unexpired, and signed by an agent CA the
// restored store knows; anything else is refused, saying why.
func TestCarriedCertificatesAreOnlyThisAuthoritysOwn(t *testing.T) {
	known, other := newTestCA(t, "known agent CA"), newTestCA(t, "another CA")
	now := time.Now()
	for _, tc := range []struct {
		name string
		c    func() store.CarriedIdentity
		want string // "": carried
	}{
		{"issued by a known CA", func() store.CarriedIdentity { return known.issue(t, "node-1", 7, now.Add(time.Hour)) }, ""},
		{"issued by another CA", func() store.CarriedIdentity { return other.issue(t, "node-1", 7, now.Add(time.Hour)) }, "signed by no agent CA the restored store knows"},
		{"expired", func() store.CarriedIdentity { return known.issue(t, "node-1", 7, now.Add(-time.Minute)) }, "expired at"},
		{"for another node", func() store.CarriedIdentity { return known.issue(t, "node-2", 7, now.Add(time.Hour)) }, "does not name agent node-1"},
		{"another key than its record's", func() store.CarriedIdentity {
			c := known.issue(t, "node-1", 7, now.Add(time.Hour))
			c.Certificate.PublicKey = make([]byte, 32)
			return c
		}, "certifies another key"},
		{"another end than its certificate's", func() store.CarriedIdentity {
			c := known.issue(t, "node-1", 7, now.Add(time.Hour))
			c.Certificate.NotAfter = c.Certificate.NotAfter.Add(24 * time.Hour)
			return c
		}, "record says valid"},
		{"another leaf than its record's", func() store.CarriedIdentity {
			c := known.issue(t, "node-1", 7, now.Add(time.Hour))
			c.Instance.LastChainPEM = known.issue(t, "node-1", 8, now.Add(time.Hour)).Instance.LastChainPEM
			return c
		}, "holds certificate 8, not 7"},
		{"no chain", func() store.CarriedIdentity {
			c := known.issue(t, "node-1", 7, now.Add(time.Hour))
			c.Instance.LastChainPEM = nil
			return c
		}, "holds no certificate chain"},
		{"a record of another instance", func() store.CarriedIdentity {
			c := known.issue(t, "node-1", 7, now.Add(time.Hour))
			c.Certificate.InstanceID = "i2"
			return c
		}, "instance i2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCarried(tc.c(), []*x509.Certificate{known.cert}, now)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
}

// TestStoreReapplyListsIdentitiesNotCarried: an identity the restored
// store says otherwise about, or one reapply does not carry, is listed
// with why and a way out that is a muster command, and nothing is
// written for it: a node re-provisioned since under an ID the restored
// store holds as its earlier instance, a bound-keypair node joined since
// (its join state is not carried), and a node joined since whose
// certificate is not one this authority issued.
func TestStoreReapplyListsIdentitiesNotCarried(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-time.Hour)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		if _, err := st.CommitJoin(ctx, testJoin("moved-01", "moved-01-a", now)); err != nil {
			t.Fatal(err)
		}
		write(t, l, "test.mark", "x", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			_, err := st.AppendAudit(ctx, b)
			return err
		})
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		j := testJoin("moved-01", "moved-01-b", now.Add(time.Minute))
		j.MaySupersede = true
		if _, err := st.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
		bk := testJoin("bound-01", "bound-01-a", now.Add(time.Minute))
		bk.Instance.JoinMethod, bk.Certificate.JoinMethod = store.JoinMethodBoundKeypair, store.JoinMethodBoundKeypair
		if _, err := st.CommitJoin(ctx, bk); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CommitJoin(ctx, testJoin("forged-01", "forged-01-a", now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
		write(t, l, "test.mark", "y", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			_, err := st.AppendAudit(ctx, b)
			return err
		})
	})
	f.restore(t)
	before := f.head(t)
	code, out, errOut := f.run(t, "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	if f.head(t) != before {
		t.Errorf("records were appended for what is only listed")
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"moved-01":  "as another node (instance moved-01-a)",
		"bound-01":  "a bound-keypair instance: its join state is not carried",
		"forged-01": "not carried: instance forged-01-a holds no certificate chain",
	}
	root := newRoot(&Env{})
	for _, n := range res.NotCarried {
		if w, ok := want[n.Node]; !ok || !strings.Contains(n.Why, w) {
			t.Errorf("listed %+v; want it saying %q", n, w)
		}
		delete(want, n.Node)
		cmds, _ := lineCommands("output", 1, n.Command)
		if len(cmds) != 1 {
			t.Errorf("%q is not one muster command", n.Command)
			continue
		}
		if problem := checkDocCommand(root, cmds[0]); problem != "" {
			t.Errorf("%q: %s", n.Command, problem)
		}
	}
	if len(want) > 0 || len(res.Steps) != 0 {
		t.Errorf("not listed: %v; steps %+v, want none", want, res.Steps)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		for _, id := range []string{"bound-01", "forged-01"} {
			if _, err := st.GetNode(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("node %s in the restored store: %v, want none", id, err)
			}
		}
		if n, err := st.GetNode(ctx, "moved-01"); err != nil || n.InstanceID != "moved-01-a" {
			t.Errorf("moved-01 in the restored store: %+v, %v; want it as it was", n, err)
		}
	})
}
