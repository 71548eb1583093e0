package referral

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// PublicKey is one ticket key as published.
type PublicKey struct {
	ID  string
	Key ed25519.PublicKey
}

// PublicJWKS returns the JWKS document of keys.
func PublicJWKS(keys []PublicKey) ([]byte, error) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Key, KeyID: k.ID, Algorithm: string(jose.EdDSA), Use: "sig"})
	}
	return json.Marshal(set)
}

// MaxJWKSBytes bounds a fetched JWKS.
const MaxJWKSBytes = 64 << 10

// ParseJWKS reads a JWKS and keeps its Ed25519 signing keys; keys of any
// other type or algorithm are ignored, so they can never verify a ticket.
func ParseJWKS(data []byte) (map[string]ed25519.PublicKey, error) {
	if len(data) > MaxJWKSBytes {
		return nil, fmt.Errorf("referral: JWKS larger than %d bytes", MaxJWKSBytes)
	}
	// Keys are decoded one by one: go-jose refuses a whole set over one key
	// it cannot represent (an X25519 key, a new kty), and such a key must
	// be skipped, not cost every other key (RFC 7517, section 5).
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("referral: JWKS: %w", err)
	}
	keys := map[string]ed25519.PublicKey{}
	for _, raw := range set.Keys {
		var k jose.JSONWebKey
		if k.UnmarshalJSON(raw) != nil {
			continue
		}
		// A private key (published by mistake) is not a PublicKey, so it
		// is skipped too: anyone could sign with it.
		pub, ok := k.Key.(ed25519.PublicKey)
		if !ok || k.KeyID == "" || (k.Algorithm != "" && k.Algorithm != string(jose.EdDSA)) || (k.Use != "" && k.Use != "sig") {
			continue
		}
		keys[k.KeyID] = pub
	}
	return keys, nil
}

// Refresh periods of a KeyCache.
const (
	// RefreshEvery is the default scheduled refresh; it bounds how long a
	// key discovery revoked stays trusted. One small HTTPS request a
	// minute per replica is cheap.
	RefreshEvery = time.Minute
	// MinRefreshEvery and MaxRefreshEvery bound a configured period. A
	// scheduled fetch restarts RefetchAfter like any other, so a period
	// near it would leave a ticket of an unknown key ID answered "not
	// fetched yet" (retry) most of the time, however long it went
	// unpublished; past the maximum a revoked key stays trusted too long.
	MinRefreshEvery = 3 * RefetchAfter
	MaxRefreshEvery = 10 * time.Minute
	// RefetchAfter is the least time between two fetches caused by an
	// unknown key ID, so a stream of made-up key IDs cannot turn the
	// authority into a flood against discovery.
	RefetchAfter = 10 * time.Second
	// FetchTimeout bounds one fetch, whatever Fetch does: a fetch holds
	// the one fetch slot (and, for a refetch, outlives its caller), so
	// one that never ended would stop every later refresh and every
	// look-up of a new key.
	FetchTimeout = 30 * time.Second
)

// KeyCache is the authority's copy of discovery's JWKS: refreshed on a
// schedule (Run) and when a ticket names a key it does not hold. Safe for
// concurrent use; a fetch never holds up the look-up of a known key.
type KeyCache struct {
	// Fetch returns the JWKS document; the caller pins discovery's TLS
	// identity.
	Fetch func(ctx context.Context) ([]byte, error)
	// OnRefresh, if set, is told each fetch's outcome.
	OnRefresh func(err error)
	// Every is the scheduled refresh's period; 0 means RefreshEvery.
	Every time.Duration

	now          func() time.Time // nil: time.Now
	fetchTimeout time.Duration    // 0: FetchTimeout

	fetchMu sync.Mutex // one fetch at a time; taken before mu
	mu      sync.Mutex // guards keys and fetched
	keys    map[string]ed25519.PublicKey
	fetched time.Time // last fetch attempt
}

func (c *KeyCache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// lookup returns the key with id kid, and whether a fetch for an unknown
// kid is due.
func (c *KeyCache) lookup(kid string) (ed25519.PublicKey, bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[kid]
	return k, ok, c.clock().Sub(c.fetched) >= RefetchAfter
}

// TicketKey returns the key with id kid, fetching the JWKS again first if
// it is unknown and the last fetch is older than RefetchAfter. It returns
// ErrUnknownKey when a fetch did not find it, ErrKeyNotFetched when none
// was due, or the fetch's error.
func (c *KeyCache) TicketKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok, due := c.lookup(kid); ok {
		return k, nil
	} else if !due {
		return nil, ErrKeyNotFetched
	}
	c.fetchMu.Lock()
	defer c.fetchMu.Unlock()
	// Another caller may have fetched while this one waited.
	k, ok, due := c.lookup(kid)
	if ok {
		return k, nil
	}
	if !due {
		return nil, ErrKeyNotFetched
	}
	// The fetch outlives a caller who gives up: it spends the refetch
	// slot, so it must finish and learn the new keys for the next one.
	if err := c.refreshLocked(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	if k, ok, _ := c.lookup(kid); ok {
		return k, nil
	}
	return nil, ErrUnknownKey
}

// Refresh fetches the JWKS now.
func (c *KeyCache) Refresh(ctx context.Context) error {
	c.fetchMu.Lock()
	defer c.fetchMu.Unlock()
	return c.refreshLocked(ctx)
}

// refreshLocked fetches the JWKS; c.fetchMu is held, c.mu is not.
func (c *KeyCache) refreshLocked(ctx context.Context) error {
	if c.Fetch == nil {
		return errors.New("referral: no JWKS source")
	}
	c.mu.Lock()
	c.fetched = c.clock()
	c.mu.Unlock()
	timeout := c.fetchTimeout
	if timeout <= 0 {
		timeout = FetchTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	data, err := c.Fetch(ctx)
	if err == nil {
		var keys map[string]ed25519.PublicKey
		if keys, err = ParseJWKS(data); err == nil {
			c.mu.Lock()
			c.keys = keys
			c.mu.Unlock()
		}
	}
	if c.OnRefresh != nil {
		c.OnRefresh(err)
	}
	if err != nil {
		return fmt.Errorf("referral: fetching discovery's ticket keys: %w", err)
	}
	return nil
}

// Run refreshes the cache every c.Every (RefreshEvery by default) until
// ctx ends. A failed refresh keeps the keys held; the next ticket with an
// unknown key ID tries again.
func (c *KeyCache) Run(ctx context.Context) error {
	every := c.Every
	if every <= 0 {
		every = RefreshEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		_ = c.Refresh(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
