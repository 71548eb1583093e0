package trustbundle

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/muster-dev/muster/internal/ca"
)

func bundle(t testing.TB) Bundle {
	t.Helper()
	h, err := ca.Create("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return Bundle{AuthorityID: "test-abc123", TrustDomain: "test-abc123",
		Roots: []string{string(ca.EncodeCertPEM(h.Root))}, Endpoints: []string{"127.0.0.1:7443"}}
}

func TestSignVerify(t *testing.T) {
	b := bundle(t)
	key := Key("abcdef", []byte("0123456789abcdef"))
	now := time.Unix(1700000000, 0)
	jws, err := Sign(b, "abcdef", key, now)
	if err != nil {
		t.Fatal(err)
	}
	v, err := Verify(jws, "abcdef", key)
	if err != nil {
		t.Fatal(err)
	}
	if v.AuthorityID != b.AuthorityID || len(v.RootCerts) != 1 || !v.IssuedAt.Equal(now) {
		t.Fatalf("Verify = %+v", v)
	}

	// The header must hold alg, kid, iat and the authority ID.
	hdr, _ := base64.RawURLEncoding.DecodeString(strings.Split(jws, ".")[0])
	var m map[string]any
	json.Unmarshal(hdr, &m)
	if m["alg"] != "HS256" || m["kid"] != "abcdef" || m["iat"] != float64(now.Unix()) || m["authority_id"] != b.AuthorityID {
		t.Fatalf("protected header %s", hdr)
	}
}

func TestVerifyRefusals(t *testing.T) {
	b := bundle(t)
	key := Key("abcdef", []byte("0123456789abcdef"))
	good, _ := Sign(b, "abcdef", key, time.Now())
	parts := strings.Split(good, ".")

	otherBundle := b
	otherBundle.AuthorityID = "evil-000000"
	evilPayload, _ := json.Marshal(otherBundle)

	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	es, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: ecKey},
		(&jose.SignerOptions{}).WithHeader("kid", "abcdef"))
	esObj, _ := es.Sign([]byte(`{}`))
	esJWS, _ := esObj.CompactSerialize()

	noneHeader := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"abcdef"}`))

	noRoots := b
	noRoots.Roots = nil
	noRootsJWS, _ := Sign(noRoots, "abcdef", key, time.Now())

	tests := []struct {
		name, jws, kid string
		key            []byte
	}{
		{"wrong secret", good, "abcdef", Key("abcdef", []byte("0123456789abcdeg"))},
		{"wrong token id", good, "zzzzzz", key},
		{"swapped payload", parts[0] + "." + base64.RawURLEncoding.EncodeToString(evilPayload) + "." + parts[2], "abcdef", key},
		{"ES256", esJWS, "abcdef", key},
		{"alg none", noneHeader + "." + parts[1] + ".", "abcdef", key},
		{"garbage", "a.b.c", "abcdef", key},
		{"no roots", noRootsJWS, "abcdef", key},
		{"oversized", strings.Repeat("a", MaxSize+1), "abcdef", key},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Verify(tt.jws, tt.kid, tt.key); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Verify = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestKeyDependsOnBothParts(t *testing.T) {
	a := Key("abcdef", []byte("0123456789abcdef"))
	if string(a) == string(Key("abcdeg", []byte("0123456789abcdef"))) || string(a) == string(Key("abcdef", []byte("0123456789abcdeg"))) {
		t.Fatal("key ignores part of the token")
	}
	if len(a) != 32 {
		t.Fatalf("key is %d bytes", len(a))
	}
}

func FuzzVerify(f *testing.F) {
	b := bundle(f)
	key := Key("abcdef", []byte("0123456789abcdef"))
	good, _ := Sign(b, "abcdef", key, time.Now())
	f.Add(good)
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Verify(s, "abcdef", key)
		if err != nil {
			return
		}
		// Only a genuinely signed bundle may verify.
		if v.AuthorityID != b.AuthorityID {
			t.Fatalf("forged bundle verified: %+v", v.Bundle)
		}
	})
}
