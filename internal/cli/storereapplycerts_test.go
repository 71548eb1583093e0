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
	"fmt"
	"math/big"
	"net/url"
	"slices"
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
	// One record: moved-01's old instance superseded.
	if f.head(t) != before+1 {
		t.Errorf("records %d to %d appended, want one, for the old instance superseded", before+1, f.head(t))
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"moved-01":  "re-provisioned since the backup (instance moved-01-a superseded by moved-01-b)",
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
	if len(want) > 0 || len(res.Steps) != 1 || !strings.HasPrefix(res.Steps[0].What, "retire superseded instance moved-01-a") {
		t.Errorf("not listed: %v; steps %+v, want only moved-01-a superseded", want, res.Steps)
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
		// Left current, the old instance would renew: the store kept
		// aside refuses it superseded, and so does the restored store.
		if in, err := st.GetInstance(ctx, "moved-01-a"); err != nil || in.State != store.InstanceSuperseded {
			t.Errorf("moved-01-a in the restored store: %+v, %v; want it superseded", in, err)
		}
	})
}

// testRenewal is the renewal of instance from generation gen, issued at
// issued.
func testRenewal(node, instance string, gen int64, issued time.Time) store.Renewal {
	issued = issued.UTC().Truncate(time.Microsecond)
	sn := fmt.Sprintf("%x", fmt.Sprintf("%s/%d", instance, gen+1))
	return store.Renewal{InstanceID: instance, FromGeneration: gen, ChainPEM: []byte("chain"),
		Certificate: store.Certificate{Serial: sn, NodeID: node, InstanceID: instance, Generation: gen + 1, JoinMethod: store.JoinMethodPSK, TokenID: "psk-1",
			PublicKey: []byte("k-" + instance), NotBefore: issued, NotAfter: issued.Add(time.Hour), IssuedAt: issued}}
}

// TestStoreReapplyRetiresInstancesDeletedOrSupersededSince: an instance
// the store kept aside holds deleted or superseded is written so in the
// restored store, with the certificates it got since the backup. A node
// that renewed and was deleted since: the CRL's list names its
// certificate issued since (before, only the backup's: relying parties
// accepted the deleted node's live certificate). A node re-provisioned
// since (its instance superseded by a join): the old instance is
// superseded (before, it stayed current and renewed), and the new one is
// listed as not carried when it cannot be. A node deleted and joined
// again since: its old instance's certificate issued since is on the CRL
// too. A second run re-applies nothing.
func TestStoreReapplyRetiresInstancesDeletedOrSupersededSince(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-10 * time.Minute)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, n := range []string{"del-01", "prov-01", "back-01"} {
			if _, err := st.CommitJoin(ctx, testJoin(n, n+"-a", now)); err != nil {
				t.Fatal(err)
			}
		}
		write(t, l, "test.mark", "x", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			_, err := st.AppendAudit(ctx, b)
			return err
		})
	})
	f.backUp(t)
	var since []string
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		for _, n := range []string{"del-01", "prov-01", "back-01"} {
			r := testRenewal(n, n+"-a", 0, now.Add(time.Minute))
			if _, err := st.CommitRenewal(ctx, r); err != nil {
				t.Fatal(err)
			}
			since = append(since, r.Certificate.Serial)
		}
		write(t, l, "agent.delete", "del-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error { return st.DeleteNode(ctx, "del-01", b) })
		write(t, l, "agent.delete", "back-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.DeleteNode(ctx, "back-01", b)
		})
		if _, err := st.CommitJoin(ctx, testJoin("back-01", "back-01-b", now.Add(2*time.Minute))); err != nil {
			t.Fatal(err)
		}
		j := testJoin("prov-01", "prov-01-b", now.Add(2*time.Minute))
		j.MaySupersede = true
		if _, err := st.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	})
	f.restore(t)
	code, out, errOut := f.run(t, "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"prov-01": "re-provisioned since the backup", "back-01": "instance back-01-b holds no certificate chain"}
	for _, n := range res.NotCarried {
		if !strings.Contains(n.Why, want[n.Node]) || want[n.Node] == "" {
			t.Errorf("not carried: %+v; want it saying %q", n, want[n.Node])
		}
		delete(want, n.Node)
	}
	if len(want) > 0 {
		t.Errorf("not listed as not carried: %v", want)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		for id, want := range map[string]string{"del-01-a": store.InstanceDeleted, "prov-01-a": store.InstanceSuperseded, "back-01-a": store.InstanceDeleted} {
			in, err := st.GetInstance(ctx, id)
			if err != nil || in.State != want || in.Generation != 1 {
				t.Errorf("instance %s after reapply: %+v, %v; want it %s at generation 1", id, in, err, want)
			}
		}
		for _, sn := range since {
			if _, err := st.GetCertificate(ctx, sn); err != nil {
				t.Errorf("certificate %s issued since the backup: %v", sn, err)
			}
		}
		revoked, err := st.ListRevokedCertificates(ctx, now.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var serials []string
		for _, c := range revoked {
			serials = append(serials, c.Serial)
		}
		for _, sn := range []string{since[0], fmt.Sprintf("%x", "del-01-a"), since[2], fmt.Sprintf("%x", "back-01-a")} {
			if !slices.Contains(serials, sn) {
				t.Errorf("the CRL's list %v lacks the deleted node's certificate %s", serials, sn)
			}
		}
		if slices.Contains(serials, since[1]) {
			t.Errorf("the CRL's list %v names %s of a superseded instance: the store kept aside's does not", serials, since[1])
		}
	})
	before := f.head(t)
	code, out, errOut = f.run(t, "--apply")
	if code != 0 || !strings.Contains(out, "Nothing to re-apply") || f.head(t) != before {
		t.Errorf("reapply run again: exit %d, records %d to %d\n%s%s", code, before, f.head(t), out, errOut)
	}
	// Restored from the same backup once more, the store re-applied kept
	// aside: the same instances come out retired, with their certificates.
	f.restore(t)
	if code, out, errOut := f.run(t, "--apply"); code != 0 {
		t.Fatalf("reapply after a second restore: exit %d\n%s%s", code, out, errOut)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		for id, want := range map[string]string{"del-01-a": store.InstanceDeleted, "prov-01-a": store.InstanceSuperseded, "back-01-a": store.InstanceDeleted} {
			if in, err := st.GetInstance(ctx, id); err != nil || in.State != want || in.Generation != 1 {
				t.Errorf("instance %s after the second restore's reapply: %+v, %v; want it %s at generation 1", id, in, err, want)
			}
		}
		for _, sn := range since {
			if _, err := st.GetCertificate(ctx, sn); err != nil {
				t.Errorf("certificate %s after the second restore's reapply: %v", sn, err)
			}
		}
	})
}

// TestStoreReapplyNamesABoundKeyRotatedSince: a bound-keypair agent whose
// key was rotated since the backup is listed with the way out that keeps
// the old key out (deleting the token), not a resync window: the
// restored store binds the old key again, and outside a window whoever
// holds it refreshes. Before, the line named only the window.
func TestStoreReapplyNamesABoundKeyRotatedSince(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-10 * time.Minute)
	bot := func(key string) store.Token {
		tok := testToken("bot-01", 0, now)
		tok.JoinMethod = store.JoinMethodBoundKeypair
		tok.BoundKeypair = &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 1, RecoveryMode: "standard"}, BoundPublicKey: key}
		return tok
	}
	join := func(instance string, at time.Time) store.Join {
		j := testJoin("bot-01", instance, at)
		j.Instance.JoinMethod, j.Certificate.JoinMethod = store.JoinMethodBoundKeypair, store.JoinMethodBoundKeypair
		j.Credential, j.Instance.TokenID, j.Certificate.TokenID = "bot-01", "bot-01", "bot-01"
		return j
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		write(t, l, "token.create", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.InsertToken(ctx, bot("SHA256:old"), b)
		})
		if _, err := st.CommitJoin(ctx, join("bot-01-a", now)); err != nil {
			t.Fatal(err)
		}
		write(t, l, "test.mark", "x", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			_, err := st.AppendAudit(ctx, b)
			return err
		})
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		// The refresh that rotated the key, as the store kept aside
		// holds it: the token binds the new key, the instance advanced.
		write(t, l, "token.delete", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.DeleteToken(ctx, "bot-01", b)
		})
		write(t, l, "token.create", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.InsertToken(ctx, bot("SHA256:new"), b)
		})
		r := testRenewal("bot-01", "bot-01-a", 0, now.Add(time.Minute))
		r.Certificate.JoinMethod, r.Certificate.TokenID = store.JoinMethodBoundKeypair, "bot-01"
		if _, err := st.CommitRenewal(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
	f.restore(t)
	code, out, errOut := f.run(t, "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.NotCarried) != 1 || res.NotCarried[0].Command != "muster token delete bot-01" ||
		!strings.Contains(res.NotCarried[0].Why, "its bound key was rotated since the backup (the store kept aside binds SHA256:new, the restored store SHA256:old again") {
		t.Fatalf("not carried: %+v, want bot-01 named with its key rotated since and the token deleted as the way out", res.NotCarried)
	}
	cmds, _ := lineCommands("output", 1, res.NotCarried[0].Command)
	if len(cmds) != 1 {
		t.Fatalf("%q is not one muster command", res.NotCarried[0].Command)
	}
	if problem := checkDocCommand(newRoot(&Env{}), cmds[0]); problem != "" {
		t.Errorf("%q: %s", res.NotCarried[0].Command, problem)
	}
}
