package jwtsvid

import (
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

func fixedDerive(seed byte) func(string, int) []byte {
	return func(info string, n int) []byte {
		sum := sha256.Sum256([]byte(info))
		b := make([]byte, n)
		for i := range b {
			b[i] = seed ^ sum[i%len(sum)]
		}
		return b
	}
}

// The key is a function of the storage key and the version: replicas
// agree, versions differ.
func TestDeriveKey(t *testing.T) {
	a, err := DeriveKey(fixedDerive(1), 1, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DeriveKey(fixedDerive(1), 1, "")
	c, _ := DeriveKey(fixedDerive(1), 2, "")
	d, _ := DeriveKey(fixedDerive(2), 1, "")
	if !a.Priv.Equal(b.Priv) || a.ID != b.ID || !strings.HasPrefix(a.ID, "v1-") {
		t.Fatalf("same inputs, different keys: %s %s", a.ID, b.ID)
	}
	if a.Priv.Equal(c.Priv) || a.ID == c.ID || a.Priv.Equal(d.Priv) {
		t.Fatal("another version or storage key gave the same key")
	}
}

// A salt makes another key, and another key ID, of the same version: a
// version reached again after a restore with a new salt. No salt derives
// the key as before salts were kept, so a store's keys of that time keep
// their key IDs across the upgrade.
func TestDeriveKeySalted(t *testing.T) {
	legacy, err := DeriveKey(fixedDerive(1), 3, "")
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	asBefore := func(info string, n int) []byte {
		seen = append(seen, info)
		return fixedDerive(1)(info, n)
	}
	if k, _ := DeriveKey(asBefore, 3, ""); !k.Priv.Equal(legacy.Priv) || seen[0] != "muster-jwt-svid-key-v3" {
		t.Fatalf("no salt derived from %q", seen)
	}
	a, err := DeriveKey(fixedDerive(1), 3, "0a1b")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DeriveKey(fixedDerive(1), 3, "0a1c")
	again, _ := DeriveKey(fixedDerive(1), 3, "0a1b")
	if !a.Priv.Equal(again.Priv) || a.ID != again.ID {
		t.Fatal("one salt, two keys")
	}
	for _, other := range []Key{legacy, b} {
		if a.Priv.Equal(other.Priv) || a.ID == other.ID || !strings.HasPrefix(a.ID, "v3-") {
			t.Fatalf("salted key %s, other %s: want another key and key ID of version 3", a.ID, other.ID)
		}
	}
	if _, err := DeriveKey(fixedDerive(1), 3, "0A-1"); err == nil {
		t.Fatal("a salt that is not lowercase hexadecimal was taken")
	}
	i, err := NewVersioned(fixedDerive(1), 3, Salts{Prev: "01", Cur: "0a1b", Next: "03"})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := DeriveKey(fixedDerive(1), 2, "01")
	n, _ := DeriveKey(fixedDerive(1), 4, "03")
	if got := i.KeyVersions(); i.KeyID() != a.ID || len(got) != 3 || got[p.ID] != 2 || got[a.ID] != 3 || got[n.ID] != 4 {
		t.Fatalf("salted issuer signs with %s, publishes %v; want %s, %s, %s", i.KeyID(), got, p.ID, a.ID, n.ID)
	}
}

func TestMintVerifiesWithJWKS(t *testing.T) {
	k, _ := DeriveKey(func(string, int) []byte { b := make([]byte, 32); rand.Read(b); return b }, 1, "")
	iss, err := NewIssuer(k)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok, exp, err := iss.Mint("spiffe://td/agent/n1", []string{"db"}, now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if d := exp.Sub(now); d > TTL || d < TTL-time.Second {
		t.Fatalf("lifetime %v", d)
	}
	raw, _ := iss.JWKS()
	var set jose.JSONWebKeySet
	if err := jsonUnmarshal(raw, &set); err != nil || len(set.Keys) != 1 || set.Keys[0].KeyID != k.ID || !set.Keys[0].IsPublic() {
		t.Fatalf("JWKS %s: %v", raw, err)
	}
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Headers[0].KeyID != k.ID {
		t.Errorf("kid %q", parsed.Headers[0].KeyID)
	}
	var c jwt.Claims
	if err := parsed.Claims(set.Keys[0].Key, &c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(jwt.Expected{Subject: "spiffe://td/agent/n1", AnyAudience: []string{"db"}, Time: now}); err != nil {
		t.Fatal(err)
	}
	// Never past the caller's certificate; none for an expired one.
	if _, exp, _ := iss.Mint("s", []string{"a"}, now, now.Add(time.Minute)); exp.After(now.Add(time.Minute)) {
		t.Errorf("expiry %v past the certificate's", exp)
	}
	if _, _, err := iss.Mint("s", []string{"a"}, now, now); err == nil {
		t.Error("minted for an expired certificate")
	}
}

func FuzzCheckAudiences(f *testing.F) {
	f.Add("db", "cache", 2)
	f.Add("", "", 1)
	f.Add(strings.Repeat("a", 300), "b", 9)
	f.Fuzz(func(t *testing.T, a, b string, n int) {
		var aud []string
		for i := 0; i < n%12; i++ {
			aud = append(aud, []string{a, b}[i%2])
		}
		if CheckAudiences(aud) != nil {
			return
		}
		if len(aud) == 0 || len(aud) > MaxAudiences {
			t.Fatalf("accepted %d audiences", len(aud))
		}
		for _, x := range aud {
			if x == "" || len(x) > MaxAudienceLen {
				t.Fatalf("accepted audience of %d bytes", len(x))
			}
		}
	})
}

// A version's issuer signs with that version's key and publishes the
// previous, current and next ones: a token minted before a rotation
// verifies with the JWKS after it, one minted after with the JWKS before.
func TestNewVersionedPublishesNeighbours(t *testing.T) {
	kids := func(i *Issuer) map[string]jose.JSONWebKey {
		raw, err := i.JWKS()
		if err != nil {
			t.Fatal(err)
		}
		var set jose.JSONWebKeySet
		if err := jsonUnmarshal(raw, &set); err != nil {
			t.Fatal(err)
		}
		m := map[string]jose.JSONWebKey{}
		for _, k := range set.Keys {
			m[k.KeyID] = k
		}
		return m
	}
	v1, err := NewVersioned(fixedDerive(1), 1, Salts{})
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := NewVersioned(fixedDerive(1), 2, Salts{})
	k1, _ := DeriveKey(fixedDerive(1), 1, "")
	k2, _ := DeriveKey(fixedDerive(1), 2, "")
	k3, _ := DeriveKey(fixedDerive(1), 3, "")
	if v1.KeyID() != k1.ID || v2.KeyID() != k2.ID || v2.Version() != 2 {
		t.Fatalf("signing keys %s %s, want %s %s", v1.KeyID(), v2.KeyID(), k1.ID, k2.ID)
	}
	if got := kids(v1); len(got) != 2 || got[k1.ID].Key == nil || got[k2.ID].Key == nil {
		t.Fatalf("version 1's JWKS: %v, want v1 and v2", got)
	}
	if got := kids(v2); len(got) != 3 || got[k1.ID].Key == nil || got[k2.ID].Key == nil || got[k3.ID].Key == nil {
		t.Fatalf("version 2's JWKS: %v, want v1, v2 and v3", got)
	}
	now := time.Now()
	verify := func(tok string, with *Issuer) error {
		parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			return err
		}
		k, ok := kids(with)[parsed.Headers[0].KeyID]
		if !ok {
			return jose.ErrJWKSKidNotFound
		}
		var c jwt.Claims
		return parsed.Claims(k.Key, &c)
	}
	before, _, _ := v1.Mint("spiffe://td/agent/n1", []string{"db"}, now, now.Add(time.Hour))
	after, _, _ := v2.Mint("spiffe://td/agent/n1", []string{"db"}, now, now.Add(time.Hour))
	if err := verify(before, v2); err != nil {
		t.Errorf("a token of version 1 with version 2's JWKS: %v", err)
	}
	if err := verify(after, v1); err != nil {
		t.Errorf("a token of version 2 with version 1's JWKS: %v", err)
	}
	v4, _ := NewVersioned(fixedDerive(1), 4, Salts{})
	if err := verify(before, v4); err == nil {
		t.Error("version 4's JWKS still verifies a token of version 1")
	}
	if _, err := NewVersioned(fixedDerive(1), 0, Salts{}); err == nil {
		t.Error("version 0 accepted")
	}
}
