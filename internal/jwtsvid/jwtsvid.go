// Package jwtsvid mints the JWT-SVIDs an agent asks for on behalf of its
// workloads (docs/workload-api.md) and publishes the keys that verify
// them as a JWKS: ES256, short-lived, subject the agent's SPIFFE ID.
//
// The signing keys are derived from the authority's storage key (HKDF,
// info "muster-jwt-svid-key-v<N>-salt-<S>"), so every replica holding the
// data directory's files derives the same key for a version; the store
// says which version is current and holds the salts. A version's salt is
// drawn at random by the rotation that makes it the next version, so a
// version number reached again after the store was restored from an
// older backup gets another key than it had before: a key made since
// the backup never signs again (the backup's own next key does: it was
// drawn before the backup; docs/workload-api.md "After a restore"). Keys
// of versions made before salts were kept have none ("muster-jwt-svid-
// key-v<N>", as they were derived then). Its key ID names the version and
// the public key's hash, so it changes with the key. The JWKS
// publishes the current version's key, the previous one's (a token
// minted just before a rotation still verifies until it expires) and the
// next one's (a replica that rotated signs with a key the JWKS of a
// replica that has not seen the rotation yet, and a relying party's
// cached copy, already hold).
package jwtsvid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// TTL is a JWT-SVID's lifetime.
const TTL = 5 * time.Minute

// Limits of a request: audiences are chosen by local workloads.
const (
	MaxAudiences   = 8
	MaxAudienceLen = 256
)

// Key is one signing key version.
type Key struct {
	ID   string
	Priv *ecdsa.PrivateKey
}

// DeriveKey makes the key of version with salt ("": none) from derive
// (the storage key's HKDF): 32 bytes taken as the P-256 scalar, the rare
// out-of-range draw redrawn.
func DeriveKey(derive func(info string, n int) []byte, version int, salt string) (Key, error) {
	if !validSalt(salt) {
		return Key{}, fmt.Errorf("%w: key version %d: salt %q is not lowercase hexadecimal", ErrSalt, version, salt)
	}
	for attempt := 0; attempt < 8; attempt++ {
		info := fmt.Sprintf("muster-jwt-svid-key-v%d", version)
		if salt != "" {
			info += "-salt-" + salt
		}
		if attempt > 0 {
			info += fmt.Sprintf("-%d", attempt)
		}
		priv, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), derive(info, 32))
		if err != nil {
			continue
		}
		der, err := json.Marshal(jose.JSONWebKey{Key: &priv.PublicKey})
		if err != nil {
			return Key{}, err
		}
		sum := sha256.Sum256(der)
		return Key{ID: fmt.Sprintf("v%d-%s", version, hex.EncodeToString(sum[:6])), Priv: priv}, nil
	}
	return Key{}, errors.New("jwtsvid: no valid key derived")
}

// ErrSalt: a version's salt, as the store holds it, is not one a
// rotation draws (lowercase hexadecimal): a damaged or hand-edited row.
// No key is derived from it: another salt would be another key, which no
// replica published.
var ErrSalt = errors.New("jwtsvid: the store's salt of a JWT-SVID key is damaged")

// validSalt: a salt is lowercase hexadecimal, so that no salt and
// attempt suffix read as another salt.
func validSalt(salt string) bool {
	for _, c := range salt {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Salts are the salts of a version's key (Cur), of the previous
// version's (Prev) and of the next one's (Next), as the store holds them
// with the version; "": a key derived from the version alone.
type Salts struct{ Prev, Cur, Next string }

// Issuer signs with its first key and publishes them all.
type Issuer struct {
	keys    []Key
	signer  jose.Signer
	version int64
	salts   Salts
	// versions are the keys' versions (a versioned issuer's), in order.
	versions []int64
	// damaged are the versions whose salt is damaged (ErrSalt): their
	// keys are neither published nor used; unsigned is the error of
	// Mint when the current version's is one of them.
	damaged  []int64
	unsigned error
}

// NewVersioned returns the issuer of version (from 1) with salts: it
// signs with version's key and publishes version's, the next one's and,
// from version 2, the previous one's. A version whose salt is damaged
// (ErrSalt: a damaged or hand-edited store) has no key: it is left out
// of the JWKS, named by Damaged, and when it is version itself, Mint
// refuses with ErrSalt.
func NewVersioned(derive func(info string, n int) []byte, version int64, salts Salts) (*Issuer, error) {
	if version < 1 {
		return nil, fmt.Errorf("jwtsvid: key version %d: want 1 or more", version)
	}
	i := &Issuer{version: version, salts: salts}
	for _, v := range []struct {
		n    int64
		salt string
	}{{version, salts.Cur}, {version + 1, salts.Next}, {version - 1, salts.Prev}} {
		if v.n < 1 {
			continue
		}
		k, err := DeriveKey(derive, int(v.n), v.salt)
		if errors.Is(err, ErrSalt) {
			i.damaged = append(i.damaged, v.n)
			if v.n == version {
				i.unsigned = err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		i.keys = append(i.keys, k)
		i.versions = append(i.versions, v.n)
	}
	if i.unsigned == nil {
		s, err := newSigner(i.keys[0])
		if err != nil {
			return nil, err
		}
		i.signer = s
	}
	return i, nil
}

// Damaged are the versions whose keys the issuer has not, their salts
// being damaged (ErrSalt): none, but for a damaged or hand-edited store.
func (i *Issuer) Damaged() []int64 { return i.damaged }

// Version is the key version the issuer signs with (0 for one made by
// NewIssuer).
func (i *Issuer) Version() int64 { return i.version }

// Salts are the salts a versioned issuer derived its keys with.
func (i *Issuer) Salts() Salts { return i.salts }

// KeyVersions maps the ID of each key a versioned issuer publishes to
// its version (nil for one made by NewIssuer).
func (i *Issuer) KeyVersions() map[string]int64 {
	if i.version == 0 {
		return nil
	}
	m := make(map[string]int64, len(i.keys))
	for n, v := range i.versions {
		m[i.keys[n].ID] = v
	}
	return m
}

// KeyID is the ID of the key the issuer signs with, "" when it signs
// with none (its version's salt is damaged).
func (i *Issuer) KeyID() string {
	if i.signer == nil {
		return ""
	}
	return i.keys[0].ID
}

// NewIssuer returns an issuer signing with keys[0].
func NewIssuer(keys ...Key) (*Issuer, error) {
	if len(keys) == 0 {
		return nil, errors.New("jwtsvid: no key")
	}
	s, err := newSigner(keys[0])
	if err != nil {
		return nil, err
	}
	return &Issuer{keys: keys, signer: s}, nil
}

func newSigner(k Key) (jose.Signer, error) {
	return jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: k.Priv, KeyID: k.ID}},
		(&jose.SignerOptions{}).WithType("JWT"))
}

// ErrAudience refuses a request's audiences.
var ErrAudience = errors.New("jwtsvid: audience")

// CheckAudiences refuses no audience, too many, an empty one, or one too long.
func CheckAudiences(aud []string) error {
	if len(aud) == 0 || len(aud) > MaxAudiences {
		return fmt.Errorf("%w: want 1 to %d audiences", ErrAudience, MaxAudiences)
	}
	for _, a := range aud {
		if a == "" || len(a) > MaxAudienceLen {
			return fmt.Errorf("%w: each audience must be 1 to %d bytes", ErrAudience, MaxAudienceLen)
		}
	}
	return nil
}

// Mint signs a JWT-SVID for subject (a SPIFFE ID) and aud, valid from now
// for TTL but never past notAfter (the agent certificate's expiry).
func (i *Issuer) Mint(subject string, aud []string, now, notAfter time.Time) (string, time.Time, error) {
	if err := CheckAudiences(aud); err != nil {
		return "", time.Time{}, err
	}
	if i.unsigned != nil {
		return "", time.Time{}, i.unsigned
	}
	exp := now.Add(TTL)
	if exp.After(notAfter) {
		exp = notAfter
	}
	if !exp.After(now) {
		return "", time.Time{}, errors.New("jwtsvid: the caller's certificate has expired")
	}
	exp = exp.Truncate(time.Second)
	tok, err := jwt.Signed(i.signer).Claims(jwt.Claims{Subject: subject, Audience: jwt.Audience(aud),
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(exp)}).Serialize()
	if err != nil {
		return "", time.Time{}, err
	}
	return tok, exp, nil
}

// JWKS is the key set relying parties verify with: every key, public half.
func (i *Issuer) JWKS() ([]byte, error) {
	set := jose.JSONWebKeySet{}
	for _, k := range i.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.Priv.PublicKey, KeyID: k.ID, Algorithm: string(jose.ES256), Use: "jwt-svid"})
	}
	return json.Marshal(set)
}
