package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
)

// JoinStateKeyStore is where the authority's join-state keys live.
type JoinStateKeyStore interface {
	InsertJoinStateKey(ctx context.Context, k store.JoinStateKey) error
	ListJoinStateKeys(ctx context.Context) ([]store.JoinStateKey, error)
}

// joinStateKeys signs join state documents with the newest key in the
// store, creating the first one on first use, and verifies with any key
// the store holds. The private keys are in custody: sealed, or objects of
// the authority's PKCS#11 token. A store row's custody reference is its
// nonce followed by its ciphertext: a sealed key's nonce and sealed seed
// (as the keys made before custody were written, which custody.Sealed
// with the join-state sealer and no prefix opens), or an empty nonce and
// a token object's pkcs11: URI. When the newest key is not where new keys
// are made (a sealed key on an authority that now has a token), a new key
// is made there and signs from then on; the old ones still verify the
// documents agents hold. Keys are cached; an unknown key ID re-reads the
// store, so a key another replica created is found. Safe for concurrent
// use.
type joinStateKeys struct {
	store   JoinStateKeyStore
	custody custody.Custody // nil: none configured
	now     func() time.Time

	mu      sync.Mutex
	signing *boundkeypair.SigningKey
	newest  *store.JoinStateKey
	public  map[string]ed25519.PublicKey
}

// joinStateKeyRef is a row's key in custody, named by its ID (a token
// object's label is muster-join-state/ID).
func joinStateKeyRef(k store.JoinStateKey) custody.Key {
	return custody.Key{Public: ed25519.PublicKey(k.PublicKey), Ref: append(append([]byte(nil), k.Nonce...), k.Ciphertext...)}
}

// makesHere reports whether a key of ref is in the custody that makes new
// keys (always, for a custody that has one place only).
func (k *joinStateKeys) makesHere(ref []byte) bool {
	if c, ok := k.custody.(interface{ MakesHere([]byte) bool }); ok {
		return c.MakesHere(ref)
	}
	return true
}

// makesInToken reports whether new keys are made in a PKCS#11 token.
func (k *joinStateKeys) makesInToken() bool {
	c, ok := k.custody.(interface{ MakesHere([]byte) bool })
	return ok && c.MakesHere([]byte("pkcs11:"))
}

// current returns the signing key.
func (k *joinStateKeys) current(ctx context.Context) (boundkeypair.SigningKey, error) {
	if k.custody == nil {
		return boundkeypair.SigningKey{}, errors.New("enroll: no join-state key custody configured")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.signing != nil {
		return *k.signing, nil
	}
	if err := k.load(ctx); err != nil {
		return boundkeypair.SigningKey{}, err
	}
	if k.newest == nil || k.sealedBeforeToken(*k.newest) {
		// None yet, or a sealed one while new keys are made in a token:
		// make one. (Never the other way: a replica without the token
		// does not replace a token key by a sealed one; it fails to
		// sign, saying the token is missing.) Two replicas doing so at
		// once both insert; the newest signs from then on and both
		// verify.
		if err := k.create(ctx); err != nil {
			return boundkeypair.SigningKey{}, err
		}
		if err := k.load(ctx); err != nil {
			return boundkeypair.SigningKey{}, err
		}
		if k.newest == nil {
			return boundkeypair.SigningKey{}, errors.New("enroll: the join-state key just written is not in the store")
		}
	}
	signer, err := k.custody.Signer(ctx, k.newest.ID, joinStateKeyRef(*k.newest))
	if err != nil {
		return boundkeypair.SigningKey{}, fmt.Errorf("enroll: join-state key %s: %w", k.newest.ID, err)
	}
	k.signing = &boundkeypair.SigningKey{ID: k.newest.ID, Private: signer}
	return *k.signing, nil
}

// sealedBeforeToken reports whether row is a sealed key while new keys
// are made in a token.
func (k *joinStateKeys) sealedBeforeToken(row store.JoinStateKey) bool {
	ref := joinStateKeyRef(row).Ref
	return !custody.IsPKCS11Ref(ref) && !k.makesHere(ref)
}

// create makes a key in custody and stores its public key and reference.
// A sealed key is made here and sealed, its ID derived from its public
// key (boundkeypair.KeyID) as join-state keys always were, so its row is
// exactly what boundkeypair.OpenSigningKey opens; a token's is generated
// inside the token, named before its public key is known, so its ID is
// random ("js-" and 16 hex digits).
func (k *joinStateKeys) create(ctx context.Context) error {
	var (
		id  string
		key custody.Key
		err error
	)
	imp, canImport := k.custody.(custody.Importer)
	if canImport && !k.makesInToken() {
		nk, err := boundkeypair.NewSigningKey()
		if err != nil {
			return err
		}
		id = nk.ID
		key, err = imp.Import(ctx, id, nk.Private)
		clear(nk.Private.(ed25519.PrivateKey))
		if err != nil {
			return fmt.Errorf("enroll: seal a join-state key: %w", err)
		}
	} else {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		id = "js-" + hex.EncodeToString(b[:])
		if key, err = k.custody.Create(ctx, id, custody.Ed25519); err != nil {
			return fmt.Errorf("enroll: make a join-state key: %w", err)
		}
	}
	pub, ok := key.Public.(ed25519.PublicKey)
	if !ok {
		return fmt.Errorf("enroll: join-state key %s: custody made a %T", id, key.Public)
	}
	row := store.JoinStateKey{ID: id, PublicKey: pub, Nonce: []byte{}, Ciphertext: key.Ref, CreatedAt: store.StoredTime(k.now())}
	if !custody.IsPKCS11Ref(key.Ref) {
		if len(key.Ref) <= 12 {
			return fmt.Errorf("enroll: join-state key %s: a sealed reference too short", id)
		}
		row.Nonce, row.Ciphertext = key.Ref[:12], key.Ref[12:]
	}
	if err := k.store.InsertJoinStateKey(ctx, row); err != nil {
		k.custody.Destroy(context.WithoutCancel(ctx), id, key)
		return err
	}
	return nil
}

// load reads every key; the caller holds mu.
func (k *joinStateKeys) load(ctx context.Context) error {
	ks, err := k.store.ListJoinStateKeys(ctx)
	if err != nil {
		return err
	}
	pub := make(map[string]ed25519.PublicKey, len(ks))
	for _, sk := range ks {
		pub[sk.ID] = ed25519.PublicKey(sk.PublicKey)
	}
	k.public = pub
	k.newest = nil
	if len(ks) > 0 {
		k.newest = &ks[0]
	}
	return nil
}

// lookup returns the public key of kid, re-reading the store once for an
// unknown one.
func (k *joinStateKeys) lookup(ctx context.Context) func(kid string) (ed25519.PublicKey, bool) {
	return func(kid string) (ed25519.PublicKey, bool) {
		k.mu.Lock()
		defer k.mu.Unlock()
		if p, ok := k.public[kid]; ok {
			return p, true
		}
		if k.load(ctx) != nil {
			return nil, false
		}
		p, ok := k.public[kid]
		return p, ok
	}
}

// joinStateKeys returns the Service's join-state keys.
func (s *Service) joinStateKeys() *joinStateKeys { return s.jsKeys }
