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
	"github.com/muster-dev/muster/internal/boundkeypair"
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
		"bound-01":  "a bound-keypair instance whose join state is not carried",
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

// TestStoreReapplyCarriesABoundKeyRotatedSince: a bound-keypair agent
// whose key was rotated by a refresh since the backup gets its join state
// carried with its identity: the restored token binds the key it holds
// now, so the key rotated away is refused again (before, the restored
// token bound it, and whoever held it refreshed), and its refresh with the
// current key and join state is a plain refresh, no resync window needed;
// the join-state key made since is carried, so its document verifies. A
// second reapply writes nothing.
func TestStoreReapplyCarriesABoundKeyRotatedSince(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Microsecond)
	ca := newTestCA(t, "agent CA")
	tok := testToken("bot-01", 0, now)
	tok.JoinMethod = store.JoinMethodBoundKeypair
	tok.BoundKeypair = &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 1, RecoveryMode: store.RecoveryStandard},
		SecretCiphertext: []byte("sealed"), SecretNonce: []byte("nonce")}
	join := testJoin("bot-01", "bot-01-a", now)
	join.Instance.JoinMethod, join.Certificate.JoinMethod = store.JoinMethodBoundKeypair, store.JoinMethodBoundKeypair
	join.Credential, join.Instance.TokenID, join.Certificate.TokenID = "bot-01", "bot-01", "bot-01"
	join.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-01", PublicKey: "SHA256:old", UseRegistrationSecret: true},
		store.Recovery{TokenID: "bot-01", Counted: true}}
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		write(t, l, "ca.prepare", "ca agent", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.InsertCACert(ctx, store.CACert{Role: "agent", Serial: "ca01", CertDER: ca.cert.Raw, KeyRef: []byte("ref"),
				State: store.CAPrepared, NotAfter: ca.cert.NotAfter}, b)
		})
		write(t, l, "token.create", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.InsertToken(ctx, tok, b)
		})
		if _, err := st.CommitJoin(ctx, join); err != nil {
			t.Fatal(err)
		}
	})
	f.backUp(t)
	// The refresh since the backup that rotated the key, as the store
	// kept aside holds it: a certificate of generation 1, the token bound
	// to the new key, its document signed with a join-state key made since.
	cert := ca.issue(t, "bot-01", 9, now.Add(time.Hour))
	r := store.Renewal{InstanceID: "bot-01-a", FromGeneration: 0, ChainPEM: cert.Instance.LastChainPEM,
		Certificate: store.Certificate{Serial: cert.Certificate.Serial, NodeID: "bot-01", InstanceID: "bot-01-a", Generation: 1,
			JoinMethod: store.JoinMethodBoundKeypair, TokenID: "bot-01", PublicKey: cert.Certificate.PublicKey,
			NotBefore: cert.Certificate.NotBefore, NotAfter: cert.Certificate.NotAfter, IssuedAt: now.Add(time.Minute)},
		Claims: []store.Claim{store.KeyBinding{TokenID: "bot-01", Expected: "SHA256:old", PublicKey: "SHA256:new", Rotate: true}}}
	jsk := store.JoinStateKey{ID: "js-since", PublicKey: []byte("pub"), Ciphertext: []byte("ct"), Nonce: []byte("nonce-12byte"), CreatedAt: now.Add(time.Minute)}
	var had store.BoundKeypair
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		if _, err := st.CommitRenewal(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := st.InsertJoinStateKey(ctx, jsk); err != nil {
			t.Fatal(err)
		}
		got, err := st.GetToken(ctx, "bot-01")
		if err != nil {
			t.Fatal(err)
		}
		had = *got.BoundKeypair
	})
	f.restore(t)
	before := f.head(t)
	code, out, errOut := f.run(t, "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.NotCarried) != 0 {
		t.Errorf("not carried: %+v, want bot-01 carried", res.NotCarried)
	}
	if f.head(t) != before+3 {
		t.Errorf("records %d to %d appended, want three (identity, join-state key, join state): %+v", before+1, f.head(t), res.Steps)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		got, err := st.GetToken(ctx, "bot-01")
		if err != nil {
			t.Fatal(err)
		}
		bk := *got.BoundKeypair
		if bk.BoundPublicKey != "SHA256:new" || bk.RecoverySequence != had.RecoverySequence || bk.Epoch != had.Epoch || !bk.LastRotatedAt.Equal(had.LastRotatedAt) {
			t.Fatalf("the restored token after reapply: %+v, want the store kept aside's %+v", bk, had)
		}
		// The key rotated away: a refresh's write from it is refused.
		old := store.Renewal{InstanceID: "bot-01-a", FromGeneration: 1, ChainPEM: []byte("chain"),
			Certificate: store.Certificate{Serial: "0old", NodeID: "bot-01", InstanceID: "bot-01-a", Generation: 2, JoinMethod: store.JoinMethodBoundKeypair,
				TokenID: "bot-01", PublicKey: []byte("k"), NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now},
			Claims: []store.Claim{store.KeyBinding{TokenID: "bot-01", Expected: "SHA256:old", PublicKey: "SHA256:old"}}}
		if _, err := st.CommitRenewal(ctx, old); !errors.Is(err, store.ErrKeyBindingChanged) {
			t.Errorf("a refresh with the key rotated away: %v, want %v", err, store.ErrKeyBindingChanged)
		}
		// The current key with its document (the token's sequence and
		// epoch) and certificate (the instance's, carried): a refresh, no
		// resync window.
		in, err := st.GetInstance(ctx, "bot-01-a")
		if err != nil {
			t.Fatal(err)
		}
		if in.LastSerial != cert.Certificate.Serial || in.Generation != 1 || bk.BoundInstanceID != in.ID {
			t.Errorf("the instance after reapply: generation %d, serial %s, bound instance %s; want generation 1, serial %s, bound",
				in.Generation, in.LastSerial, bk.BoundInstanceID, cert.Certificate.Serial)
		}
		doc := boundkeypair.JoinState{Token: "bot-01", NodeID: "bot-01", RecoverySequence: had.RecoverySequence, Epoch: had.Epoch}
		v, err := boundkeypair.Judge(boundkeypair.Status{Mode: bk.Spec.RecoveryMode, Limit: bk.Spec.RecoveryLimit, Count: bk.RecoveryCount,
			Sequence: bk.RecoverySequence, Epoch: bk.Epoch}, boundkeypair.Attempt{Refresh: true, State: &doc}, boundkeypair.Epochs{Ordinal: map[string]int64{}})
		if err != nil || v.Recovery {
			t.Errorf("the refresh with the current key after reapply: %+v, %v; want a plain refresh", v, err)
		}
		renew := r
		renew.FromGeneration, renew.Certificate.Generation, renew.Certificate.Serial = 1, 2, "0new"
		renew.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-01", Expected: "SHA256:new", PublicKey: "SHA256:new"}}
		keys, err := st.ListJoinStateKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(keys, func(k store.JoinStateKey) bool { return k.ID == jsk.ID }) {
			t.Errorf("join-state keys after reapply: %+v, want %s carried", keys, jsk.ID)
		}
		if _, err := st.CommitRenewal(ctx, renew); err != nil {
			t.Errorf("a refresh with the current key after reapply: %v", err)
		}
	})
	// Run again: nothing left to write.
	before = f.head(t)
	code, out, errOut = f.run(t, "--apply")
	if code != 0 || f.head(t) != before {
		t.Errorf("reapply run again: exit %d, records %d to %d\n%s%s", code, before, f.head(t), out, errOut)
	}
}

// TestStoreReapplyListsAJoinStateOfAWindowOpenedSince: a bound-keypair
// token that entered the epoch of a resync window opened since the
// backup, which the restored store does not know, is not carried (its
// documents of that epoch would be taken for a second holder's): its
// agent is listed with a resync window as its way out, and nothing of it
// is written.
func TestStoreReapplyListsAJoinStateOfAWindowOpenedSince(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Microsecond)
	tok := testToken("bot-01", 0, now)
	tok.JoinMethod = store.JoinMethodBoundKeypair
	tok.BoundKeypair = &store.BoundKeypair{Spec: store.BoundKeypairSpec{RecoveryLimit: 3, RecoveryMode: store.RecoveryStandard},
		SecretCiphertext: []byte("sealed"), SecretNonce: []byte("nonce")}
	join := testJoin("bot-01", "bot-01-a", now)
	join.Instance.JoinMethod, join.Certificate.JoinMethod = store.JoinMethodBoundKeypair, store.JoinMethodBoundKeypair
	join.Credential, join.Instance.TokenID, join.Certificate.TokenID = "bot-01", "bot-01", "bot-01"
	join.Claims = []store.Claim{store.KeyBinding{TokenID: "bot-01", PublicKey: "SHA256:old", UseRegistrationSecret: true},
		store.Recovery{TokenID: "bot-01", Counted: true}}
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		write(t, l, "token.create", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.InsertToken(ctx, tok, b)
		})
		if _, err := st.CommitJoin(ctx, join); err != nil {
			t.Fatal(err)
		}
	})
	f.backUp(t)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		// A window opened since, in whose epoch the token was resynced.
		link, err := l.Builder(audit.Event{Actor: "test", Action: "bound_keypair.resync.open", Target: "epoch", Result: audit.ResultOK})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.OpenResync(ctx, store.ResyncOpen{ID: "ep-1", For: time.Hour, OpenedBy: "test", Reason: "test"},
			func(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) { return link.Build }); err != nil {
			t.Fatal(err)
		}
		l.Appended(link)
		got, err := st.GetToken(ctx, "bot-01")
		if err != nil {
			t.Fatal(err)
		}
		state := *got.BoundKeypair
		state.Epoch, state.RecoverySequence = "ep-1", 4
		write(t, l, "token.resync", "token bot-01", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			return st.CarryJoinState(ctx, store.CarriedJoinState{TokenID: "bot-01", Held: *got.BoundKeypair, State: state}, b)
		})
		if _, err := st.CommitRenewal(ctx, testRenewal("bot-01", "bot-01-a", 0, now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	})
	f.restore(t)
	before := f.head(t)
	code, out, errOut := f.run(t, "--apply", "-o", "json")
	if code != 0 {
		t.Fatalf("store reapply: exit %d\n%s%s", code, out, errOut)
	}
	var res reapplyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.NotCarried) != 1 || !strings.Contains(res.NotCarried[0].Why, "its token entered epoch ep-1 since the backup") ||
		res.NotCarried[0].Command != `muster bound-keypair resync open --for 24h --reason "restored the store from a backup"` {
		t.Fatalf("not carried: %+v, want bot-01 with its epoch since and a resync window", res.NotCarried)
	}
	for _, s := range res.Steps {
		if strings.Contains(s.What, "bot-01") {
			t.Errorf("step %+v: want nothing of bot-01 written", s)
		}
	}
	if f.head(t) != before {
		t.Errorf("records %d to %d appended, want none", before+1, f.head(t))
	}
}

// TestStoreReapplyRetireRefusedIsNotInPlace: a retire step refused
// because the restored store changed after the plan read it (here the
// instance renewed in between, still current) is reported as a conflict
// naming the command to run again, and the run exits non-zero; run again,
// it retires the instance. Before, every refused retire was reported "in
// place" with exit 0, the instance left current to renew again.
func TestStoreReapplyRetireRefusedIsNotInPlace(t *testing.T) {
	f := newReapplyFixture(t)
	now := time.Now().Add(-10 * time.Minute)
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		if _, err := st.CommitJoin(ctx, testJoin("prov-01", "prov-01-a", now)); err != nil {
			t.Fatal(err)
		}
		write(t, l, "test.mark", "x", func(b func(store.AuditHead) (store.AuditRecord, error)) error {
			_, err := st.AppendAudit(ctx, b)
			return err
		})
	})
	f.backUp(t)
	renewal := testRenewal("prov-01", "prov-01-a", 0, now.Add(time.Minute))
	f.with(t, f.db, func(ctx context.Context, st store.Store, l *audit.Logger) {
		if _, err := st.CommitRenewal(ctx, renewal); err != nil {
			t.Fatal(err)
		}
		j := testJoin("prov-01", "prov-01-b", now.Add(2*time.Minute))
		j.MaySupersede = true
		if _, err := st.CommitJoin(ctx, j); err != nil {
			t.Fatal(err)
		}
	})
	f.restore(t)
	reapplyPlanned = func(ctx context.Context, st store.Store) {
		if _, err := st.CommitRenewal(ctx, renewal); err != nil {
			t.Errorf("renewing between the plan and its writes: %v", err)
		}
	}
	code, out, errOut := f.run(t, "--apply")
	reapplyPlanned = nil
	if code == 0 || strings.Contains(out, "prov-01-a of node prov-01 at generation 1 (the restored store holds it current at generation 0): in place") ||
		!strings.Contains(out, ": conflict") || !strings.Contains(errOut, "muster store reapply --offline --data") {
		t.Fatalf("reapply with the instance renewed after the plan: exit %d\n%s%s\nwant a conflict, the command to run again, and a non-zero exit", code, out, errOut)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		if in, err := st.GetInstance(ctx, "prov-01-a"); err != nil || in.State != store.InstanceCurrent {
			t.Fatalf("instance after the refused retire: %+v, %v; want it still current (nothing written)", in, err)
		}
	})
	if code, out, errOut := f.run(t, "--apply"); code != 0 {
		t.Fatalf("reapply run again: exit %d\n%s%s", code, out, errOut)
	}
	f.with(t, f.db, func(ctx context.Context, st store.Store, _ *audit.Logger) {
		if in, err := st.GetInstance(ctx, "prov-01-a"); err != nil || in.State != store.InstanceSuperseded || in.Generation != 1 {
			t.Errorf("instance after reapply run again: %+v, %v; want it superseded at generation 1", in, err)
		}
	})
}
