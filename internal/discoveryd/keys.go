package discoveryd

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/store"
)

// Ticket key lifecycle.
const (
	// DefaultKeyRotation is how long a ticket key signs before the next
	// one takes over.
	DefaultKeyRotation = 24 * time.Hour
	// KeyOverlap is how long a retired key stays in the JWKS: longer than
	// a ticket lives (referral.TTL plus the clock-skew allowance) and than
	// an authority takes to fetch the new key, so no ticket in flight is
	// orphaned.
	KeyOverlap = 10 * time.Minute
	// keyReload bounds how stale the in-memory keys may be, so a rotation
	// by another process (muster discovery rotate-key, a replica) is seen
	// within seconds.
	keyReload = 5 * time.Second
	// signDelay is how old a new key must be, by the store clock, before
	// it signs. Every replica publishes it within keyReload; an authority
	// that fetched the JWKS from a replica just before it did fetches
	// again on the new key ID only once referral.RefetchAfter has passed,
	// and until then refuses the key's tickets (PERMISSION_DENIED, which
	// ends an agent's run). Signing after both have passed means no
	// ticket names a key an authority may not fetch.
	signDelay = keyReload + referral.RefetchAfter
)

// KeyID names a ticket key: the first 16 hex digits of SHA-256 of the
// public key, so the ID says which key it is on every replica.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// newTicketKey generates a key and its store record, the private key
// sealed with the key ID as additional data, so a ciphertext moved to
// another row does not open.
func newTicketKey(sealer *seal.Sealer) (store.TicketKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return store.TicketKey{}, err
	}
	k := store.TicketKey{ID: KeyID(pub), PublicKey: pub, Status: store.TicketKeyActive}
	if k.Ciphertext, k.Nonce, err = sealer.Seal(priv.Seed(), []byte(k.ID)); err != nil {
		return store.TicketKey{}, err
	}
	return k, nil
}

// openTicketKey unseals a key and checks it is the key its record names.
func openTicketKey(sealer *seal.Sealer, k store.TicketKey) (ed25519.PrivateKey, error) {
	seed, err := sealer.Open(k.Ciphertext, k.Nonce, []byte(k.ID))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("discoveryd: ticket key %s does not decrypt with this data directory's storage key (does the store belong to another discovery?)", k.ID)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	if !bytes.Equal(priv.Public().(ed25519.PublicKey), k.PublicKey) || KeyID(k.PublicKey) != k.ID {
		return nil, fmt.Errorf("discoveryd: ticket key %s does not match its public key", k.ID)
	}
	return priv, nil
}

// active returns the active key of keys, or nil.
func active(keys []store.TicketKey) *store.TicketKey {
	for i := range keys {
		if keys[i].Status == store.TicketKeyActive {
			return &keys[i]
		}
	}
	return nil
}

// Rotation is the outcome of a ticket key rotation.
type Rotation struct {
	// From is the retired key ("" when the first key was installed);
	// it stays published until PublishUntil.
	From         string
	To           string
	PublishUntil time.Time
}

// ErrRotated is returned by rotate when another process changed the
// active key first; nothing was written.
var ErrRotated = errors.New("discoveryd: another process rotated the ticket key at the same time")

// rotate makes a new active key, retiring fromID (the active key, or ""
// when there is none) with KeyOverlap. Of several rotations from one key,
// across processes, exactly one succeeds; the others get ErrRotated.
func rotate(ctx context.Context, st store.DiscoveryStore, sealer *seal.Sealer, fromID string, overlap time.Duration) (Rotation, error) {
	next, err := newTicketKey(sealer)
	if err != nil {
		return Rotation{}, err
	}
	if fromID == "" {
		overlap = 0
	}
	switch err := st.RotateTicketKey(ctx, fromID, next, overlap); {
	case errors.Is(err, store.ErrConflict):
		return Rotation{}, ErrRotated
	case err != nil:
		return Rotation{}, fmt.Errorf("discoveryd: rotating the ticket key: %w", err)
	}
	r := Rotation{From: fromID, To: next.ID}
	if fromID != "" {
		keys, err := st.ListTicketKeys(ctx)
		if err != nil {
			return r, nil
		}
		for _, k := range keys {
			if k.ID == fromID {
				r.PublishUntil = k.PublishUntil
			}
		}
	}
	return r, nil
}

// keyStore is what the keyring reads: the ticket keys and the store
// clock their times are on.
type keyStore interface {
	store.DiscoveryStore
	Now(ctx context.Context) (time.Time, error)
}

// keyring holds the signing key and the JWKS in memory, read again from
// the store at most every keyReload. Safe for concurrent use.
//
// A key that has just become active is published at once but signs only
// once it is signDelay old (the previous key, still published, signs
// meanwhile): by then every replica serving the JWKS has reloaded and
// publishes it, and an authority that fetched the JWKS before one had
// may fetch again, so an authority that fetches the JWKS for a ticket's
// key never finds it missing.
type keyring struct {
	st        keyStore
	sealer    *seal.Sealer
	now       func() time.Time
	log       *slog.Logger
	signDelay time.Duration

	mu     sync.Mutex
	loaded time.Time
	signer *signingKey
	// activeID and created are the active key's, created by the store
	// clock; the rotation schedule follows them.
	activeID string
	created  time.Time
	jwks     []byte
	// opened caches unsealed keys by ID.
	opened map[string]ed25519.PrivateKey
}

type signingKey struct {
	id  string
	key ed25519.PrivateKey
}

func newKeyring(st keyStore, sealer *seal.Sealer, log *slog.Logger) *keyring {
	return &keyring{st: st, sealer: sealer, now: time.Now, log: log, signDelay: signDelay, opened: map[string]ed25519.PrivateKey{}}
}

// ensure installs a first key when the store has none. Another process
// installing one at the same time is not an error: its key is used.
func (k *keyring) ensure(ctx context.Context) (installed string, err error) {
	keys, err := k.st.ListTicketKeys(ctx)
	if err != nil {
		return "", err
	}
	if active(keys) == nil {
		r, err := rotate(ctx, k.st, k.sealer, "", 0)
		switch {
		case errors.Is(err, ErrRotated):
		case err != nil:
			return "", err
		default:
			installed = r.To
		}
	}
	return installed, k.reload(ctx)
}

// reload reads the keys from the store now.
func (k *keyring) reload(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reloadLocked(ctx)
}

func (k *keyring) reloadLocked(ctx context.Context) error {
	keys, err := k.st.ListTicketKeys(ctx)
	if err != nil {
		return fmt.Errorf("discoveryd: reading the ticket keys: %w", err)
	}
	a := active(keys)
	if a == nil {
		return errors.New("discoveryd: the store holds no active ticket key")
	}
	// Every time a key record carries is the store's: judge them by the
	// store clock, so replicas whose clocks differ agree on which key
	// signs and which are published (a revoked key leaves every replica's
	// JWKS at its next reload, not once a slow clock catches up).
	storeNow, err := k.st.Now(ctx)
	if err != nil {
		return fmt.Errorf("discoveryd: reading the store clock: %w", err)
	}
	signWith := a
	if k.signDelay > 0 {
		if storeNow.Sub(a.CreatedAt) < k.signDelay {
			if p := previous(keys, storeNow.Add(referral.TTL+referral.Leeway)); p != nil {
				signWith = p
			}
		}
	}
	priv, ok := k.opened[signWith.ID]
	if !ok {
		if priv, err = openTicketKey(k.sealer, *signWith); err != nil {
			return err
		}
	}
	var pubs []referral.PublicKey
	for _, t := range keys {
		if t.Status != store.TicketKeyActive && !storeNow.Before(t.PublishUntil) {
			continue
		}
		if len(t.PublicKey) != ed25519.PublicKeySize {
			return fmt.Errorf("discoveryd: ticket key %s: public key of %d bytes", t.ID, len(t.PublicKey))
		}
		pubs = append(pubs, referral.PublicKey{ID: t.ID, Key: ed25519.PublicKey(t.PublicKey)})
	}
	jwks, err := referral.PublicJWKS(pubs)
	if err != nil {
		return err
	}
	k.signer, k.activeID, k.created, k.jwks, k.loaded = &signingKey{signWith.ID, priv}, a.ID, a.CreatedAt, jwks, k.now()
	k.opened = map[string]ed25519.PrivateKey{signWith.ID: priv}
	return nil
}

// previous is the newest retired key still published past until, or nil.
func previous(keys []store.TicketKey, until time.Time) *store.TicketKey {
	var p *store.TicketKey
	for i := range keys {
		k := &keys[i]
		if k.Status == store.TicketKeyRetired && k.PublishUntil.After(until) && (p == nil || k.CreatedAt.After(p.CreatedAt)) {
			p = k
		}
	}
	return p
}

// freshLocked reloads when the keys are older than keyReload. A failed
// reload keeps the keys held, which were valid seconds ago, rather than
// refuse every ticket while the store hiccups; it is tried again after
// keyReload, not at every request.
func (k *keyring) freshLocked(ctx context.Context) error {
	if k.signer != nil && k.now().Sub(k.loaded) < keyReload {
		return nil
	}
	err := k.reloadLocked(ctx)
	if err != nil && k.signer != nil {
		k.loaded = k.now()
		k.log.Warn("cannot reload the ticket keys; keeping the ones held", "err", err)
		return nil
	}
	return err
}

// current returns the key tickets are signed with.
func (k *keyring) current(ctx context.Context) (*signingKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.freshLocked(ctx); err != nil {
		return nil, err
	}
	return k.signer, nil
}

// JWKS returns the published keys: the active one and the retired ones
// still in their overlap.
func (k *keyring) JWKS(ctx context.Context) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.freshLocked(ctx); err != nil {
		return nil, err
	}
	return k.jwks, nil
}

// activeSince is the active key and its creation time.
func (k *keyring) activeSince() (string, time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.activeID, k.created
}
