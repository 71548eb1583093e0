package enroll

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// JoinStateKeyStore is where the authority's join-state keys live.
type JoinStateKeyStore interface {
	InsertJoinStateKey(ctx context.Context, k store.JoinStateKey) error
	ListJoinStateKeys(ctx context.Context) ([]store.JoinStateKey, error)
}

// joinStateKeys signs join state documents with the newest key in the
// store, creating the first one on first use, and verifies with any key
// the store holds. Keys are cached; an unknown key ID re-reads the store,
// so a key another replica created is found. Safe for concurrent use.
type joinStateKeys struct {
	store  JoinStateKeyStore
	sealer *seal.Sealer
	now    func() time.Time

	mu      sync.Mutex
	signing *boundkeypair.SigningKey
	public  map[string]ed25519.PublicKey
}

// current returns the signing key.
func (k *joinStateKeys) current(ctx context.Context) (boundkeypair.SigningKey, error) {
	if k.sealer == nil {
		return boundkeypair.SigningKey{}, errors.New("enroll: no join-state sealer configured")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.signing != nil {
		return *k.signing, nil
	}
	if err := k.load(ctx); err != nil {
		return boundkeypair.SigningKey{}, err
	}
	if k.signing != nil {
		return *k.signing, nil
	}
	// None yet: make one. Two replicas doing so at once both insert; the
	// newest signs from then on and both verify.
	nk, err := boundkeypair.NewSigningKey()
	if err != nil {
		return boundkeypair.SigningKey{}, err
	}
	ct, nonce, err := nk.Seal(k.sealer)
	if err != nil {
		return boundkeypair.SigningKey{}, err
	}
	if err := k.store.InsertJoinStateKey(ctx, store.JoinStateKey{ID: nk.ID, PublicKey: nk.Public(), Ciphertext: ct,
		Nonce: nonce, CreatedAt: store.StoredTime(k.now())}); err != nil {
		return boundkeypair.SigningKey{}, err
	}
	if err := k.load(ctx); err != nil {
		return boundkeypair.SigningKey{}, err
	}
	if k.signing == nil {
		return boundkeypair.SigningKey{}, errors.New("enroll: the join-state key just written is not in the store")
	}
	return *k.signing, nil
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
	if len(ks) > 0 && k.sealer != nil {
		sk, err := boundkeypair.OpenSigningKey(k.sealer, ks[0].ID, ks[0].Ciphertext, ks[0].Nonce)
		if err != nil {
			return err
		}
		k.signing = &sk
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
