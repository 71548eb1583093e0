package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	"github.com/muster-dev/muster/internal/trustbundle"
)

// fakeAudit keeps events in memory; Builder writes through to the store's
// chain like audit.Logger does, so joins commit as in production.
type fakeAudit struct {
	mu      sync.Mutex
	events  []audit.Event
	refused []audit.Event
}

func (f *fakeAudit) Record(_ context.Context, e audit.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
	return nil
}

func (f *fakeAudit) Refuse(_ context.Context, e audit.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused = append(f.refused, e)
}

// lastRefused is the last refusal audited; none fails t.
func (f *fakeAudit) lastRefused(t *testing.T) audit.Event {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.refused) == 0 {
		t.Fatal("no refusal audited")
	}
	return f.refused[len(f.refused)-1]
}

func (f *fakeAudit) Builder(e audit.Event) (*audit.Link, error) {
	return audit.NewLink(e, func(h store.AuditHead) (store.AuditRecord, error) {
		return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte{byte(h.Seq + 1)}, Time: time.Now(),
			Action: e.Action, Result: e.Result}, nil
	}), nil
}

func (f *fakeAudit) Appended(link *audit.Link) { f.Record(context.Background(), link.Event()) }

type env struct {
	svc   *Service
	st    *sqlite.SQLite
	audit *fakeAudit
	seal  *seal.Sealer
	h     *ca.Hierarchy
}

var (
	hierOnce sync.Once
	hier     *ca.Hierarchy
)

func newEnv(t testing.TB, wrap func(Store) Store) *env {
	t.Helper()
	hierOnce.Do(func() {
		var err error
		if hier, err = ca.Create("test", time.Now()); err != nil {
			panic(err)
		}
	})
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sk, _ := seal.DeriveStorageKey(hier.RootKey)
	sealer, _ := sk.Sealer(seal.InfoToken)
	e := &env{st: st, audit: &fakeAudit{}, seal: sealer, h: hier}
	var s Store = st
	if wrap != nil {
		s = wrap(st)
	}
	e.svc, err = New(Config{Store: s, Audit: e.audit, CA: hier, AuthorityID: "test-abcdef", TrustDomain: "test-abcdef",
		TokenSealer: sealer, DecoyKey: make([]byte, 32), AgentCertTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) token(t *testing.T, uses int64) jointoken.Token {
	t.Helper()
	tok, _ := jointoken.Generate()
	ct, nonce, _ := e.seal.Seal(tok.Secret(), []byte(tok.ID))
	if err := e.st.InsertToken(t.Context(), store.Token{ID: tok.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		UsesAllowed: uses, CreatedAt: time.Now()}, setupLink); err != nil {
		t.Fatal(err)
	}
	return tok
}

func csr(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func wantRefusal(t *testing.T, err error, kind Kind, reason string) {
	t.Helper()
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Kind != kind || (reason != "" && ref.Reason != reason) {
		t.Fatalf("err = %v, want refusal kind %d %q", err, kind, reason)
	}
}

func TestDecoyBundleIsStableAndUnverifiable(t *testing.T) {
	e := newEnv(t, nil)
	a, err := e.svc.TrustBundle(t.Context(), Request{}, "zzzzzz")
	if err != nil {
		t.Fatal(err)
	}
	// Asking twice must not tell a decoy from a real token by its key.
	b, _ := e.svc.TrustBundle(t.Context(), Request{}, "zzzzzz")
	if _, err := trustbundle.Verify(a, "zzzzzz", e.svc.decoyKey("zzzzzz")); err != nil {
		t.Fatalf("decoy does not verify under the decoy key: %v", err)
	}
	if _, err := trustbundle.Verify(b, "zzzzzz", e.svc.decoyKey("zzzzzz")); err != nil {
		t.Fatalf("second decoy uses another key: %v", err)
	}
	tok := e.token(t, 1)
	real, _ := e.svc.TrustBundle(t.Context(), Request{}, tok.ID)
	if _, err := trustbundle.Verify(real, tok.ID, trustbundle.Key(tok.ID, tok.Secret())); err != nil {
		t.Fatalf("real bundle: %v", err)
	}
}

// deletingStore deletes the token just before the join's write, as an
// operator racing the join would.
type deletingStore struct{ Store }

func (d deletingStore) CommitJoin(ctx context.Context, j store.Join) (store.JoinResult, error) {
	d.Store.(*sqlite.SQLite).DeleteToken(ctx, j.TokenID, setupLink)
	return d.Store.CommitJoin(ctx, j)
}

func TestTokenDeletedDuringJoin(t *testing.T) {
	e := newEnv(t, func(s Store) Store { return deletingStore{s} })
	tok := e.token(t, 1)
	_, der := csr(t)
	_, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	wantRefusal(t, err, KindNotFound, "")
	if _, err := e.st.GetNode(t.Context(), "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("node written: %v", err)
	}
}

func TestJoinRetryRefusedWhenLocked(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	_, der := csr(t)
	first, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil || !again.Retry || string(again.ChainPEM) != string(first.ChainPEM) {
		t.Fatalf("retry: %v (retry %v)", err, again != nil && again.Retry)
	}
	e.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockInstance, Target: first.InstanceID, CreatedAt: time.Now()}, setupLink)
	_, err = e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
}

// TestConcurrentRenewals: several holders of one generation renew at once
// with different keys. Exactly one wins; the authority judges each loser
// again against what the winner did, and finds a copy.
func TestConcurrentRenewals(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	_, der := csr(t)
	joined, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", der)
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM(joined.ChainPEM)
	const n = 6
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		_, der := csr(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.svc.Renew(context.Background(), Request{}, chain[0], der)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	ok, copies := 0, 0
	for err := range errs {
		var ref *Refusal
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ref) && (ref.Reason == ReasonCopyDetected || ref.Reason == ReasonLocked):
			copies++
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	if ok != 1 || copies != n-1 {
		t.Fatalf("%d renewed, %d refused as copies; want 1 and %d", ok, copies, n-1)
	}
	inst, _ := e.st.GetInstance(t.Context(), joined.InstanceID)
	if inst.Generation != 1 {
		t.Fatalf("generation %d, want 1", inst.Generation)
	}
	if _, err := e.st.FindAnyLock(t.Context(), []store.LockTarget{{Kind: store.LockInstance, Target: inst.ID}}); err != nil {
		t.Fatalf("copied instance not locked: %v", err)
	}
}

func TestJoinWithoutCSRFillsAKeystore(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	iss, err := e.svc.ExchangeJoinToken(t.Context(), Request{}, tok.Reveal(), "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(iss.PKCS12) == 0 || len(iss.PKCS12Password) < 20 {
		t.Fatalf("keystore %d bytes, password %d characters", len(iss.PKCS12), len(iss.PKCS12Password))
	}
	if len(e.audit.events) != 1 || e.audit.events[0].Action != "agent.join" || e.audit.events[0].Result != audit.ResultOK {
		t.Fatalf("audit events %+v", e.audit.events)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	e := newEnv(t, nil)
	good := e.svc.cfg
	for name, mutate := range map[string]func(*Config){
		"no store":        func(c *Config) { c.Store = nil },
		"ttl too long":    func(c *Config) { c.AgentCertTTL = 8 * 24 * time.Hour },
		"short decoy key": func(c *Config) { c.DecoyKey = []byte("short") },
	} {
		c := good
		mutate(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestTrustBundleLeavesOutExpired: the bundle signed for a token holds
// the server and bootstrap intermediates until their NotAfter (inclusive)
// and not after it, whatever the CA clock has retired yet.
func TestTrustBundleLeavesOutExpired(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.token(t, 1)
	notAfter := e.h.Issuers[ca.RoleServer].Cert.NotAfter
	for _, c := range []struct {
		at            time.Time
		intermediates int
	}{
		{notAfter, 2},
		{notAfter.Add(time.Second), 0},
	} {
		e.svc.cfg.Now = func() time.Time { return c.at }
		jws, err := e.svc.TrustBundle(t.Context(), Request{}, tok.ID)
		if err != nil {
			t.Fatal(err)
		}
		v, err := trustbundle.Verify(jws, tok.ID, trustbundle.Key(tok.ID, tok.Secret()))
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Bundle.Roots) != 1 || len(v.Bundle.Intermediates) != c.intermediates {
			t.Errorf("at %s (the intermediates expire at %s): %d roots, %d intermediates; want 1 and %d",
				c.at, notAfter, len(v.Bundle.Roots), len(v.Bundle.Intermediates), c.intermediates)
		}
	}
}

// setupLink is the audit record a test's own store write (a lock it sets
// up) carries; the service's fakeAudit never hears of it.
func setupLink(h store.AuditHead) (store.AuditRecord, error) {
	return store.AuditRecord{Seq: h.Seq + 1, PrevHash: h.Hash, Hash: []byte{byte(h.Seq + 1)}, Time: time.Now(),
		Action: "test.setup", Result: audit.ResultOK}, nil
}

// setupEpochLink is setupLink for a resync window a test opens.
func setupEpochLink(store.ResyncEpoch) func(store.AuditHead) (store.AuditRecord, error) {
	return setupLink
}
