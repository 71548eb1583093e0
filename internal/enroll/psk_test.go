package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// pskEnv is an env whose service validates PSKs, recording what it tells
// its observer and its grace expiry hook.
type pskEnv struct {
	*env
	psks    *seal.Sealer
	mu      sync.Mutex
	results []string
	expired int
}

func newPSKEnv(t testing.TB) *pskEnv {
	t.Helper()
	e := &pskEnv{env: newEnv(t, nil)}
	sk, _ := seal.DeriveStorageKey(e.h.RootKey)
	e.psks, _ = sk.Sealer(seal.InfoPSK)
	e.svc.cfg.PSKSealer = e.psks
	e.svc.cfg.PSKObserver = func(r string) { e.mu.Lock(); e.results = append(e.results, r); e.mu.Unlock() }
	e.svc.cfg.ExpireGracePSKs = func(ctx context.Context) {
		e.mu.Lock()
		e.expired++
		e.mu.Unlock()
		e.st.RevokeExpiredGracePSKs(ctx, func([]string) func(store.AuditHead) (store.AuditRecord, error) { return setupLink })
	}
	return e
}

func (e *pskEnv) sealed(t testing.TB, key psk.PSK, status string) store.PSK {
	t.Helper()
	p := store.PSK{ID: "psk-" + uuid.NewString(), Status: status, CreatedAt: time.Now()}
	var err error
	if p.Ciphertext, p.Nonce, err = e.psks.Seal(key.Bytes(), []byte(p.ID)); err != nil {
		t.Fatal(err)
	}
	return p
}

// active stores a new active PSK.
func (e *pskEnv) active(t testing.TB) (psk.PSK, string) {
	t.Helper()
	key, _ := psk.Generate()
	p := e.sealed(t, key, store.PSKActive)
	if err := e.st.InsertPSK(t.Context(), p, setupLink); err != nil {
		t.Fatal(err)
	}
	return key, p.ID
}

// rotate replaces the active PSK from, which goes to grace.
func (e *pskEnv) rotate(t *testing.T, from string, grace time.Duration) (psk.PSK, string) {
	t.Helper()
	key, _ := psk.Generate()
	p := e.sealed(t, key, store.PSKActive)
	if _, err := e.st.RotatePSK(t.Context(), from, p, grace, setupLink); err != nil {
		t.Fatal(err)
	}
	return key, p.ID
}

func nodeCSR(t testing.TB, cn string) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

type denyAll struct{}

func (denyAll) Allow(string) bool { return false }

// TestPSKCheckOrder: each case fails exactly one check, and the checks
// before it pass.
func TestPSKCheckOrder(t *testing.T) {
	e := newPSKEnv(t)
	key, _ := e.active(t)
	good := key.Reveal()
	if _, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, good, "", nodeCSR(t, "taken")); err != nil {
		t.Fatal(err)
	}
	e.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockNode, Target: "locked", CreatedAt: time.Now()}, setupLink)
	wrong, _ := psk.Generate()

	tests := []struct {
		name        string
		psk, ticket string
		csr         []byte
		limited     bool
		kind        Kind
		reason      string
	}{
		{name: "malformed PSK", psk: "muster-psk:zz", csr: nodeCSR(t, "n1"), kind: KindInvalid},
		{name: "referral ticket", psk: good, ticket: "a.b.c", csr: nodeCSR(t, "n1"), kind: KindInvalid, reason: reasonNoDiscovery},
		{name: "no CSR", psk: good, kind: KindInvalid},
		{name: "CSR without a node ID", psk: good, csr: nodeCSR(t, ""), kind: KindInvalid},
		{name: "CSR with a bad node ID", psk: good, csr: nodeCSR(t, "Not_A_Node"), kind: KindInvalid},
		{name: "rate limited before the PSK is looked at", psk: wrong.Reveal(), csr: nodeCSR(t, "n1"), limited: true, kind: KindRateLimited},
		{name: "missing PSK", csr: nodeCSR(t, "n1"), kind: KindPermissionDenied, reason: ReasonPSKMissing},
		{name: "wrong PSK", psk: wrong.Reveal(), csr: nodeCSR(t, "n1"), kind: KindPermissionDenied, reason: ReasonPSKMismatch},
		{name: "wrong PSK for a taken node", psk: wrong.Reveal(), csr: nodeCSR(t, "taken"), kind: KindPermissionDenied, reason: ReasonPSKMismatch},
		{name: "node taken", psk: good, csr: nodeCSR(t, "taken"), kind: KindAlreadyExists, reason: ReasonNodeTaken},
		{name: "node locked", psk: good, csr: nodeCSR(t, "locked"), kind: KindPermissionDenied, reason: ReasonLocked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.svc.cfg.Limiter = nil
			if tt.limited {
				e.svc.cfg.Limiter = denyAll{}
			}
			_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, tt.psk, tt.ticket, tt.csr)
			wantRefusal(t, err, tt.kind, tt.reason)
		})
	}
	for _, ev := range append(e.audit.refused, e.audit.events...) {
		if strings.Contains(ev.Reason+ev.Actor, good[len(psk.Prefix):]) {
			t.Fatalf("audit record holds the PSK: %+v", ev)
		}
	}
}

func TestPSKActiveGraceAndRevoked(t *testing.T) {
	e := newPSKEnv(t)
	first, firstID := e.active(t)
	second, secondID := e.rotate(t, firstID, time.Hour)

	for _, c := range []struct {
		node string
		key  psk.PSK
		id   string
		as   string
	}{{"n1", second, secondID, PSKResultActive}, {"n2", first, firstID, PSKResultGrace}} {
		iss, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, c.key.Reveal(), "", nodeCSR(t, c.node))
		if err != nil {
			t.Fatalf("%s: %v", c.node, err)
		}
		inst, _ := e.st.GetInstance(t.Context(), iss.InstanceID)
		if inst.JoinMethod != store.JoinMethodPSK || inst.TokenID != c.id {
			t.Fatalf("%s: instance %+v, want method psk and PSK %s", c.node, inst, c.id)
		}
		last := e.audit.events[len(e.audit.events)-1]
		if want := "psk " + c.id + " (" + c.as + ")"; !strings.Contains(last.Reason, want) || last.Actor != "psk:"+c.id {
			t.Fatalf("%s: audit %+v, want %q", c.node, last, want)
		}
	}
	// No token was used: nothing but PSKs exist.
	if toks, _ := e.st.ListTokens(t.Context()); len(toks) != 0 {
		t.Fatalf("tokens %+v", toks)
	}

	// A grace that ended no longer matches, and is revoked on the way.
	third, _ := e.rotate(t, secondID, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	_, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, second.Reveal(), "", nodeCSR(t, "n3"))
	wantRefusal(t, err, KindPermissionDenied, ReasonPSKMismatch)
	// Its audit record names the way out: a machine offline across two
	// rotations needs the active PSK.
	if last := e.audit.refused[len(e.audit.refused)-1]; !strings.Contains(last.Reason, "bootstrap PSK does not match: if the PSK was rotated (muster psk rotate), give this machine the active one: muster psk show prints it") {
		t.Errorf("audit reason %q names no way out", last.Reason)
	}
	if e.expired != 1 {
		t.Fatalf("expired-grace hook called %d times, want 1", e.expired)
	}
	ps, _ := e.st.ListPSKs(t.Context())
	for _, p := range ps {
		if p.ID == secondID && p.Status != store.PSKRevoked {
			t.Fatalf("ended grace PSK %s is %s, want revoked", p.ID, p.Status)
		}
	}
	if _, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, third.Reveal(), "", nodeCSR(t, "n3")); err != nil {
		t.Fatal(err)
	}
	want := []string{PSKResultActive, PSKResultGrace, PSKResultInvalid, PSKResultActive}
	if strings.Join(e.results, ",") != strings.Join(want, ",") {
		t.Fatalf("observed %v, want %v", e.results, want)
	}
}

func TestPSKRetry(t *testing.T) {
	e := newPSKEnv(t)
	key, _ := e.active(t)
	csr := nodeCSR(t, "n1")
	first, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", csr)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", csr)
	if err != nil || !again.Retry || string(again.ChainPEM) != string(first.ChainPEM) || again.InstanceID != first.InstanceID {
		t.Fatalf("retry: %v (retry %v)", err, again != nil && again.Retry)
	}
	// Another key is another request, and the node is taken.
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", nodeCSR(t, "n1"))
	wantRefusal(t, err, KindAlreadyExists, ReasonNodeTaken)
	// The same key after the PSK was revoked is judged by the PSK it
	// sends.
	e.rotate(t, mustActiveID(t, e), 0)
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", csr)
	wantRefusal(t, err, KindPermissionDenied, ReasonPSKMismatch)
}

func mustActiveID(t *testing.T, e *pskEnv) string {
	t.Helper()
	ps, err := e.st.ListPSKs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Status == store.PSKActive {
			return p.ID
		}
	}
	t.Fatal("no active PSK")
	return ""
}

func TestPSKRetryRefusedWhenLocked(t *testing.T) {
	e := newPSKEnv(t)
	key, _ := e.active(t)
	csr := nodeCSR(t, "n1")
	first, err := e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", csr)
	if err != nil {
		t.Fatal(err)
	}
	e.st.InsertLock(t.Context(), store.Lock{ID: "l1", Kind: store.LockInstance, Target: first.InstanceID, CreatedAt: time.Now()}, setupLink)
	_, err = e.svc.BootstrapWithPSK(t.Context(), Request{}, key.Reveal(), "", csr)
	wantRefusal(t, err, KindPermissionDenied, ReasonLocked)
}
