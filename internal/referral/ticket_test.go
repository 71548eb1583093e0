package referral

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
)

const (
	testIssuer    = "https://discovery.test:7450"
	testAuthority = "prod-a3f2e1"
	testNode      = "web-1"
	testKID       = "k1"
)

var testNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// mapKeys is a fixed KeySource.
type mapKeys map[string]ed25519.PublicKey

func (m mapKeys) TicketKey(_ context.Context, kid string) (ed25519.PublicKey, error) {
	if k, ok := m[kid]; ok {
		return k, nil
	}
	return nil, ErrUnknownKey
}

// failingKeys is a KeySource that cannot reach discovery.
type failingKeys struct{ err error }

func (f failingKeys) TicketKey(context.Context, string) (ed25519.PublicKey, error) { return nil, f.err }

func newKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// validClaims are a ticket discovery would issue at testNow.
func validClaims() Claims {
	return Claims{Issuer: testIssuer, AuthorityID: testAuthority, NodeID: testNode, SourceIP: "192.0.2.7",
		ID: "0123456789abcdef0123456789abcdef", IssuedAt: testNow, Expiry: testNow.Add(TTL)}
}

func issue(t testing.TB, key ed25519.PrivateKey, kid string, edit func(c *Claims)) string {
	t.Helper()
	c := validClaims()
	if edit != nil {
		edit(&c)
	}
	tok, err := Issue(key, kid, c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// rawClaims are validClaims as a JWT payload, for tickets Issue would not
// make.
func rawClaims() map[string]any {
	return map[string]any{
		"iss": testIssuer, "aud": testAuthority, "sub": testNode, "authority_id": testAuthority, "node_id": testNode,
		"jti": "0123456789abcdef0123456789abcdef", "iat": testNow.Unix(), "exp": testNow.Add(TTL).Unix(),
	}
}

// signJWT signs claims with any algorithm go-jose knows.
func signJWT(t testing.TB, alg jose.SignatureAlgorithm, key any, kid string, claims any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// unsigned is a compact JWS with alg "none" and an empty signature.
func unsigned(t testing.TB, claims any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none","kid":"k1","typ":"JWT"}`)) + "." + enc(payload) + "."
}

func withClaim(name string, value any) map[string]any {
	c := rawClaims()
	if value == nil {
		delete(c, name)
	} else {
		c[name] = value
	}
	return c
}

func TestVerify(t *testing.T) {
	pub, priv := newKey(t)
	_, otherPriv := newKey(t)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hmacKey := make([]byte, 32)
	if _, err := rand.Read(hmacKey); err != nil {
		t.Fatal(err)
	}
	keys := mapKeys{testKID: pub}
	valid := issue(t, priv, testKID, nil)

	for _, tc := range []struct {
		name      string
		token     string
		node      string // testNode if "" and not emptyNode
		emptyNode bool
		now       time.Duration // after testNow
		keys      KeySource     // keys if nil
		// wantErr is a part of the *Invalid message; "" accepts.
		wantErr     string
		wantExpired bool
		wantUnknown bool
		// wantOther: the error is not an *Invalid (the key source's).
		wantOther error
	}{
		{name: "valid", token: valid},
		{name: "valid without source IP", token: issue(t, priv, testKID, func(c *Claims) { c.SourceIP = "" })},
		{name: "valid at expiry plus leeway", token: valid, now: TTL + Leeway},
		{name: "valid when issued within the leeway in the future", token: valid, now: -Leeway},
		{name: "valid with a shorter lifetime", token: issue(t, priv, testKID, func(c *Claims) { c.Expiry = c.IssuedAt.Add(time.Second) })},
		{name: "valid with the audience as a list", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("aud", []string{testAuthority}))},

		{name: "signed by another key with the same kid", token: issue(t, otherPriv, testKID, nil), wantErr: "signature does not verify"},
		{name: "payload swapped", token: func() string {
			a, b := strings.Split(valid, "."), strings.Split(issue(t, priv, testKID, func(c *Claims) { c.NodeID = "web-2" }), ".")
			return a[0] + "." + b[1] + "." + a[2]
		}(), node: "web-2", wantErr: "signature does not verify"},
		{name: "signature truncated", token: valid[:len(valid)-4], wantErr: "signature does not verify"},
		{name: "HS256", token: signJWT(t, jose.HS256, hmacKey, testKID, rawClaims()), wantErr: `is signed with "HS256"; only EdDSA is accepted`},
		{name: "HS256 keyed with the public key", token: signJWT(t, jose.HS256, []byte(pub), testKID, rawClaims()), wantErr: `"HS256"`},
		{name: "ES256", token: signJWT(t, jose.ES256, ecKey, testKID, rawClaims()), wantErr: `is signed with "ES256"; only EdDSA is accepted`},
		{name: "alg none", token: unsigned(t, rawClaims()), wantErr: `is signed with "none"; only EdDSA is accepted`},
		{name: "no kid", token: signJWT(t, jose.EdDSA, priv, "", rawClaims()), wantErr: "has no key ID"},
		{name: "unknown kid", token: issue(t, priv, "k-rotated-away", nil), wantErr: `is signed by key "k-rotated-away", which the discovery does not publish`, wantUnknown: true},
		{name: "key source fails", token: valid, keys: failingKeys{errors.New("discovery unreachable")}, wantOther: errors.New("discovery unreachable")},

		{name: "wrong issuer", token: issue(t, priv, testKID, func(c *Claims) { c.Issuer = "https://evil.test:7450" }), wantErr: `is issued by "https://evil.test:7450", not by this authority's discovery "https://discovery.test:7450": join through discovery at discovery.test:7450, or start every discovery replica with --advertise discovery.test:7450 (or advertise: discovery.test:7450 in its discovery.yaml) and restart it, or, if the replicas advertise the ticket's issuer, set this authority's discovery.address to it`},
		{name: "no issuer", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("iss", nil)), wantErr: "is issued by"},
		{name: "wrong audience", token: issue(t, priv, testKID, func(c *Claims) { c.AuthorityID = "staging-b4c5d6" }), wantErr: "is for another authority"},
		{name: "audience differs from authority_id", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("aud", "staging-b4c5d6")), wantErr: "is for another authority"},
		{name: "authority_id differs from audience", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("authority_id", "staging-b4c5d6")), wantErr: "is for another authority"},
		{name: "no authority_id", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("authority_id", nil)), wantErr: "is for another authority"},
		{name: "two audiences", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("aud", []string{testAuthority, "staging-b4c5d6"})), wantErr: "is for another authority"},
		{name: "no audience", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("aud", nil)), wantErr: "is for another authority"},

		{name: "other node", token: valid, node: "web-2", wantErr: "names another node"},
		{name: "other sub", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("sub", "web-2")), wantErr: "names another node"},
		{name: "other node_id", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("node_id", "web-2")), wantErr: "names another node"},
		{name: "no node_id", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("node_id", nil)), wantErr: "names another node"},
		{name: "no node on either side", token: signJWT(t, jose.EdDSA, priv, testKID, func() map[string]any {
			c := rawClaims()
			delete(c, "sub")
			delete(c, "node_id")
			return c
		}()), emptyNode: true, wantErr: "names another node"},

		{name: "missing jti", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("jti", nil)), wantErr: "has no valid jti"},
		{name: "jti too long", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("jti", strings.Repeat("j", 129))), wantErr: "has no valid jti"},
		{name: "missing iat", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("iat", nil)), wantErr: "lacks iat or exp"},
		{name: "missing exp", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("exp", nil)), wantErr: "lacks iat or exp"},

		{name: "expired beyond the leeway", token: valid, now: TTL + Leeway + time.Second, wantErr: "has expired", wantExpired: true},
		{name: "expired long ago", token: valid, now: 24 * time.Hour, wantErr: "has expired", wantExpired: true},
		{name: "issued in the future beyond the leeway", token: valid, now: -Leeway - time.Second, wantErr: "is issued in the future (at 2026-"},
		{name: "issued in the future names the clocks", token: valid, now: -Leeway - time.Second, wantErr: "discovery's clock is more than 2m0s ahead of this authority's: set both right (NTP)"},
		{name: "lifetime longer than 60 s", token: issue(t, priv, testKID, func(c *Claims) { c.Expiry = c.IssuedAt.Add(TTL + time.Second) }),
			wantErr: "claims a lifetime other than 1m0s"},
		{name: "lifetime of a year", token: issue(t, priv, testKID, func(c *Claims) { c.Expiry = c.IssuedAt.Add(365 * 24 * time.Hour) }),
			wantErr: "claims a lifetime"},
		{name: "expiry before issue", token: issue(t, priv, testKID, func(c *Claims) { c.Expiry = c.IssuedAt.Add(-time.Second) }),
			wantErr: "claims a lifetime"},
		{name: "extreme times", token: signJWT(t, jose.EdDSA, priv, testKID, func() map[string]any {
			c := rawClaims()
			c["iat"], c["exp"] = int64(-1<<61), int64(1<<61)
			return c
		}()), wantErr: "claims a lifetime"},
		{name: "times out of range", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("exp", int64(1<<62))), wantErr: "has malformed claims"},
		{name: "time as a string", token: signJWT(t, jose.EdDSA, priv, testKID, withClaim("iat", "now")), wantErr: "has malformed claims"},
		{name: "signed payload not JSON", token: func() string {
			signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv}, (&jose.SignerOptions{}).WithHeader("kid", testKID))
			if err != nil {
				t.Fatal(err)
			}
			jws, err := signer.Sign([]byte("not JSON"))
			if err != nil {
				t.Fatal(err)
			}
			tok, err := jws.CompactSerialize()
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}(), wantErr: "has malformed claims"},

		{name: "oversized", token: valid + strings.Repeat("A", MaxTicketBytes), wantErr: "is too large"},
		{name: "oversized but signed", token: issue(t, priv, testKID, func(c *Claims) { c.SourceIP = strings.Repeat("1", MaxTicketBytes) }), wantErr: "is too large"},
		{name: "empty", token: "", wantErr: "is malformed"},
		{name: "garbage", token: "not a ticket", wantErr: "is malformed"},
		{name: "two parts", token: "eyJhbGciOiJFZERTQSJ9.e30", wantErr: "is malformed"},
		{name: "header not JSON", token: "bm90IGpzb24.e30.AAAA", wantErr: "is malformed"},
		{name: "payload not JSON", token: func() string {
			p := strings.Split(valid, ".")
			return p[0] + ".bm90IGpzb24." + p[2]
		}(), wantErr: "signature does not verify"},
		{name: "JSON serialization", token: func() string {
			signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv}, (&jose.SignerOptions{}).WithHeader("kid", testKID))
			if err != nil {
				t.Fatal(err)
			}
			payload, _ := json.Marshal(rawClaims())
			jws, err := signer.Sign(payload)
			if err != nil {
				t.Fatal(err)
			}
			return jws.FullSerialize()
		}(), wantErr: "is malformed"},
		{name: "encrypted JWT", token: "eyJhbGciOiJkaXIiLCJlbmMiOiJBMTI4R0NNIn0..AAAAAAAAAAAAAAAA.AAAA.AAAAAAAAAAAAAAAAAAAAAA", wantErr: `is signed with "dir"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := tc.keys
			if ks == nil {
				ks = keys
			}
			node := tc.node
			if node == "" && !tc.emptyNode {
				node = testNode
			}
			v := &Verifier{Keys: ks, Issuer: testIssuer, AuthorityID: testAuthority, Now: func() time.Time { return testNow.Add(tc.now) }}
			got, err := v.Verify(context.Background(), tc.token, node)
			if tc.wantOther != nil {
				var inv *Invalid
				if err == nil || errors.As(err, &inv) || err.Error() != tc.wantOther.Error() {
					t.Fatalf("Verify = %v, want the key source's error %v", err, tc.wantOther)
				}
				return
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if got.ID == "" || got.NodeID != node || got.AuthorityID != testAuthority || got.Issuer != testIssuer {
					t.Errorf("Verify = %+v", got)
				}
				return
			}
			var inv *Invalid
			if !errors.As(err, &inv) {
				t.Fatalf("Verify = %v (%T), want an *Invalid containing %q", err, err, tc.wantErr)
			}
			if !strings.Contains(inv.Reason, tc.wantErr) {
				t.Errorf("reason %q, want it to contain %q", inv.Reason, tc.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "referral ticket ") {
				t.Errorf("message %q does not start with \"referral ticket \"", err)
			}
			if inv.Expired != tc.wantExpired {
				t.Errorf("Expired = %v, want %v", inv.Expired, tc.wantExpired)
			}
			if inv.UnknownKey != tc.wantUnknown {
				t.Errorf("UnknownKey = %v, want %v", inv.UnknownKey, tc.wantUnknown)
			}
			if got != (Claims{}) {
				t.Errorf("a refused ticket returned claims %+v", got)
			}
		})
	}
}

func TestVerifyReturnsTheClaims(t *testing.T) {
	pub, priv := newKey(t)
	want := validClaims()
	tok, err := Issue(priv, testKID, want)
	if err != nil {
		t.Fatal(err)
	}
	v := &Verifier{Keys: mapKeys{testKID: pub}, Issuer: testIssuer, AuthorityID: testAuthority, Now: func() time.Time { return testNow }}
	got, err := v.Verify(context.Background(), tok, testNode)
	if err != nil {
		t.Fatal(err)
	}
	// cmp compares times with their Equal method: the location does not
	// matter, the instant does.
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}
	// A nil Now is the system clock, not a panic: the ticket of testNow
	// has long expired.
	v.Now = nil
	if _, err := v.Verify(context.Background(), tok, testNode); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Verify with the system clock = %v, want expired", err)
	}
}

func TestIssueRefuses(t *testing.T) {
	_, priv := newKey(t)
	for _, tc := range []struct {
		name string
		edit func(c *Claims)
	}{
		{"no issuer", func(c *Claims) { c.Issuer = "" }},
		{"no authority", func(c *Claims) { c.AuthorityID = "" }},
		{"no node", func(c *Claims) { c.NodeID = "" }},
		{"no jti", func(c *Claims) { c.ID = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validClaims()
			tc.edit(&c)
			if _, err := Issue(priv, testKID, c); err == nil {
				t.Error("Issue succeeded")
			}
		})
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := NewID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("NewID() = %q, want 32 lower-case hex digits", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

func FuzzTicketVerify(f *testing.F) {
	pub, _ := newKey(f)
	_, otherPriv := newKey(f)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	// Seeds are near misses: signed by another key under the trusted kid,
	// or by another algorithm. No mutation can turn them into a valid
	// ticket without the private key.
	forged := issue(f, otherPriv, testKID, nil)
	f.Add(forged)
	f.Add(forged[:len(forged)/2])
	f.Add(issue(f, otherPriv, "unknown", nil))
	f.Add(signJWT(f, jose.HS256, []byte(pub), testKID, rawClaims()))
	f.Add(signJWT(f, jose.ES256, ecKey, testKID, rawClaims()))
	f.Add(unsigned(f, rawClaims()))
	f.Add("")
	f.Add("..")
	f.Add("e30.e30.")
	f.Add(`{"payload":"e30","signatures":[]}`)
	f.Add(strings.Repeat("A", MaxTicketBytes+1))
	v := &Verifier{Keys: mapKeys{testKID: pub}, Issuer: testIssuer, AuthorityID: testAuthority, Now: func() time.Time { return testNow }}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(context.Background(), token, testNode)
		if err == nil {
			t.Fatalf("Verify accepted a token no one signed: %+v", c)
		}
		var inv *Invalid
		if !errors.As(err, &inv) {
			t.Fatalf("Verify = %v (%T), want an *Invalid", err, err)
		}
	})
}
