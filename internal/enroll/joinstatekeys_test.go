package enroll

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// memJoinStateKeys is a JoinStateKeyStore in memory.
type memJoinStateKeys struct {
	mu   sync.Mutex
	rows []store.JoinStateKey
}

func (m *memJoinStateKeys) InsertJoinStateKey(_ context.Context, k store.JoinStateKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.ID == k.ID {
			return store.ErrConflict
		}
	}
	m.rows = append(m.rows, k)
	return nil
}

func (m *memJoinStateKeys) ListJoinStateKeys(context.Context) ([]store.JoinStateKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]store.JoinStateKey(nil), m.rows...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// fakeToken is a custody whose references are pkcs11: URIs, its keys in
// memory: a stand-in for a PKCS#11 token in ByRef.
type fakeToken struct {
	mu   sync.Mutex
	keys map[string]ed25519.PrivateKey
}

func (f *fakeToken) Create(_ context.Context, name string, alg custody.Algorithm) (custody.Key, error) {
	if alg != custody.Ed25519 {
		return custody.Key{}, custody.ErrAlgorithm
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = map[string]ed25519.PrivateKey{}
	}
	f.keys[name] = priv
	return custody.Key{Public: pub, Ref: []byte("pkcs11:token=t;object=muster-join-state%2F" + name + ";id=%01")}, nil
}

func (f *fakeToken) Signer(_ context.Context, name string, k custody.Key) (crypto.Signer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	priv, ok := f.keys[name]
	if !ok || !priv.Public().(ed25519.PublicKey).Equal(k.Public) {
		return nil, custody.ErrKey
	}
	return opaque{priv}, nil
}

func (f *fakeToken) Destroy(_ context.Context, name string, _ custody.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, name)
	return nil
}

// opaque is a crypto.Signer that is not an ed25519.PrivateKey, as a
// token's signer is not.
type opaque struct{ k ed25519.PrivateKey }

func (o opaque) Public() crypto.PublicKey { return o.k.Public() }
func (o opaque) Sign(r io.Reader, msg []byte, opts crypto.SignerOpts) ([]byte, error) {
	return o.k.Sign(r, msg, opts)
}

// TestJoinStateKeyMovesIntoCustody: a join-state key sealed the way
// authorities always have (before custody) keeps signing under sealed
// custody; once new keys are made in a token, the next signature makes a
// token key, which signs from then on (another replica uses the same one);
// the documents the old key signed still verify; and the token key's row
// holds only its object's URI.
func TestJoinStateKeyMovesIntoCustody(t *testing.T) {
	ctx := context.Background()
	var sk seal.StorageKey
	copy(sk[:], "join-state storage key for tests")
	sealer, _ := sk.Sealer(seal.InfoJoinState)
	st := &memJoinStateKeys{}
	now := time.Now()
	clock := func() time.Time { now = now.Add(time.Second); return now }

	old, _ := boundkeypair.NewSigningKey()
	ct, nonce, err := old.Seal(sealer)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InsertJoinStateKey(ctx, store.JoinStateKey{ID: old.ID, PublicKey: old.Public(), Ciphertext: ct, Nonce: nonce,
		CreatedAt: store.StoredTime(clock())}); err != nil {
		t.Fatal(err)
	}
	js := boundkeypair.JoinState{Issuer: "a-1", Token: "bot", NodeID: "bot", IssuedAt: now.Truncate(time.Second), InstanceID: "i",
		BoundKey: "SHA256:x", RecoverySequence: 1, RecoveryLimit: 3, RecoveryMode: "standard"}
	verify := func(keys *joinStateKeys, doc, what string) {
		t.Helper()
		if _, err := boundkeypair.VerifyJoinState(doc, keys.lookup(ctx), "a-1", "bot", "bot"); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	sign := func(keys *joinStateKeys) (string, string) {
		t.Helper()
		k, err := keys.current(ctx)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := k.Sign(js)
		if err != nil {
			t.Fatal(err)
		}
		return k.ID, doc
	}
	oldDoc, _ := old.Sign(js)

	sealed := custody.NewSealedWith(sealer, "")
	plain := &joinStateKeys{store: st, custody: custody.ByRef{New: sealed, Sealed: sealed}, now: clock}
	id, doc := sign(plain)
	if id != old.ID {
		t.Fatalf("sealed custody signs with %s, want the existing key %s", id, old.ID)
	}
	verify(plain, doc, "a document signed by the existing sealed key")
	verify(plain, oldDoc, "a document signed before custody")

	tok := &fakeToken{}
	inToken := custody.ByRef{New: tok, Sealed: sealed, Token: tok}
	keys := &joinStateKeys{store: st, custody: inToken, now: clock}
	newID, newDoc := sign(keys)
	if newID == old.ID {
		t.Fatal("with a token, the sealed key still signs")
	}
	verify(keys, newDoc, "a document signed by the token's key")
	verify(keys, oldDoc, "a document signed before the move, after it")
	verify(keys, doc, "a document signed by the sealed key, after the move")
	// Another replica with the token signs with the same key.
	if id, _ := sign(&joinStateKeys{store: st, custody: inToken, now: clock}); id != newID {
		t.Errorf("another replica signs with %s, want the token key %s", id, newID)
	}
	rows, _ := st.ListJoinStateKeys(ctx)
	if len(rows) != 2 || rows[0].ID != newID {
		t.Fatalf("rows after the move: %+v", rows)
	}
	if len(rows[0].Nonce) != 0 || !custody.IsPKCS11Ref(rows[0].Ciphertext) || bytes.Contains(rows[0].Ciphertext, tok.keys[newID].Seed()) {
		t.Errorf("the token key's row: nonce %x, reference %q", rows[0].Nonce, rows[0].Ciphertext)
	}
	// The sealed replica (one without the token) refuses to sign rather
	// than go back to a sealed key; it still verifies.
	fresh := &joinStateKeys{store: st, custody: custody.ByRef{New: sealed, Sealed: sealed}, now: clock}
	if _, err := fresh.current(ctx); err == nil {
		t.Error("a replica without the token signed with the token's key")
	}
	verify(fresh, newDoc, "the token key's document on a replica without the token")
}

// TestJoinStateKeySealedNew: with sealed custody and no key yet, the key
// made is sealed in its row as before custody (no seed in the clear) and
// signs; with ByRef whose new keys are sealed, likewise.
func TestJoinStateKeySealedNew(t *testing.T) {
	ctx := context.Background()
	var sk seal.StorageKey
	copy(sk[:], "join-state storage key for tests")
	sealer, _ := sk.Sealer(seal.InfoJoinState)
	sealed := custody.NewSealedWith(sealer, "")
	for _, c := range []custody.Custody{sealed, custody.ByRef{New: sealed, Sealed: sealed}} {
		st := &memJoinStateKeys{}
		sealedNew(t, ctx, sealer, &joinStateKeys{store: st, custody: c, now: time.Now}, st)
	}
}

func sealedNew(t *testing.T, ctx context.Context, sealer *seal.Sealer, keys *joinStateKeys, st *memJoinStateKeys) {
	t.Helper()
	k, err := keys.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := st.ListJoinStateKeys(ctx)
	if len(rows) != 1 || rows[0].ID != k.ID || len(rows[0].Nonce) != 12 {
		t.Fatalf("rows: %+v", rows)
	}
	// The row is what join-state keys were before custody: it opens
	// with boundkeypair.OpenSigningKey, its ID derived from its key.
	opened, err := boundkeypair.OpenSigningKey(sealer, rows[0].ID, rows[0].Ciphertext, rows[0].Nonce)
	if err != nil || !opened.Public().Equal(k.Private.Public()) {
		t.Fatalf("the sealed row does not open as before custody: %v", err)
	}
	if bytes.Contains(rows[0].Ciphertext, k.Private.(ed25519.PrivateKey).Seed()) {
		t.Error("the row holds the seed in the clear")
	}
	doc, err := k.Sign(boundkeypair.JoinState{Issuer: "a", Token: "b", NodeID: "b", IssuedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := boundkeypair.VerifyJoinState(doc, keys.lookup(ctx), "a", "b", "b"); err != nil {
		t.Error(err)
	}
}
