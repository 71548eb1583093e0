package boundkeypair

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

func agentKey(t testing.TB) (ed25519.PrivateKey, PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return priv, k
}

func TestChallengeRoundTrip(t *testing.T) {
	now := time.Now()
	c, err := NewChallenge("prod-a3f2e1", now)
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Expiry.Sub(c.IssuedAt); d <= 0 || d > time.Minute {
		t.Fatalf("challenge lifetime %s, want at most a minute", d)
	}
	got, err := ParseChallenge(c.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got.Nonce != c.Nonce || got.Audience != c.Audience || !got.Expiry.Equal(c.Expiry) || !got.IssuedAt.Equal(c.IssuedAt) {
		t.Fatalf("parsed %+v, sent %+v", got, c)
	}
	priv, pub := agentKey(t)
	ans, err := Answer(priv, got, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(ans, pub, now.Add(30*time.Second)); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// hs256 signs claims with a shared key: an algorithm Verify must refuse.
func hs256(t *testing.T, c Challenge) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: make([]byte, 32)}, (&jose.SignerOptions{}).WithType(answerType))
	if err != nil {
		t.Fatal(err)
	}
	s, err := jwt.Signed(signer).Claims(jwt.Claims{Audience: jwt.Audience{c.Audience}, IssuedAt: jwt.NewNumericDate(c.IssuedAt)}).
		Claims(answerClaims{c.Nonce}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestChallengeVerifyRefusals(t *testing.T) {
	now := time.Now()
	c, _ := NewChallenge("prod-a3f2e1", now)
	priv, pub := agentKey(t)
	otherPriv, _ := agentKey(t)
	other, _ := NewChallenge("prod-a3f2e1", now)
	elsewhere := c
	elsewhere.Audience = "other-b4c5d6"
	sign := func(k ed25519.PrivateKey, ch Challenge, at time.Time) string {
		s, err := Answer(k, ch, at)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// A join state document signed by the agent's own key is not an answer.
	wrongType, _ := SigningKey{ID: "x", Private: priv}.Sign(JoinState{Issuer: "a", Token: "t", NodeID: "n", IssuedAt: now})
	for _, tc := range []struct {
		name   string
		answer string
		key    PublicKey
		at     time.Time
		reason string
	}{
		{"another key", sign(otherPriv, c, now), pub, now, "signature"},
		{"another challenge", sign(priv, other, now), pub, now, "another challenge"},
		{"another authority", sign(priv, elsewhere, now), pub, now, "another authority"},
		{"expired challenge", sign(priv, c, now), pub, c.Expiry.Add(time.Second), "expired"},
		{"iat far in the future", sign(priv, c, now.Add(3*time.Minute)), pub, now, "iat"},
		{"iat long before the challenge", sign(priv, c, now.Add(-3*time.Minute)), pub, now, "iat"},
		{"HS256", hs256(t, c), pub, now, "EdDSA"},
		{"wrong typ", wrongType, pub, now, "type"},
		{"not a JWT", "hello", pub, now, "EdDSA"},
		{"too large", strings.Repeat("a", MaxMessageBytes+1), pub, now, "too large"},
		{"no bound key", sign(priv, c, now), PublicKey{}, now, "no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Verify(tc.answer, tc.key, tc.at)
			var f *Failed
			if !errors.Is(err, ErrChallengeFailed) || !errors.As(err, &f) || !strings.Contains(f.Reason, tc.reason) {
				t.Fatalf("Verify = %v, want challenge_failed naming %q", err, tc.reason)
			}
		})
	}
}

func TestParseChallengeRefusals(t *testing.T) {
	c, _ := NewChallenge("prod-a3f2e1", time.Now())
	long := c
	long.Expiry = c.IssuedAt.Add(2 * time.Minute)
	noAud := c
	noAud.Audience = ""
	shortNonce := c
	shortNonce.Nonce = base64.RawURLEncoding.EncodeToString([]byte("short"))
	for name, b := range map[string][]byte{
		"not JSON":      []byte("{"),
		"too long":      long.Marshal(),
		"no audience":   noAud.Marshal(),
		"short nonce":   shortNonce.Marshal(),
		"oversize":      []byte(strings.Repeat(" ", MaxMessageBytes+1)),
		"expiry before": []byte(`{"nonce":"` + c.Nonce + `","aud":"a","iat":10,"exp":5}`),
	} {
		if _, err := ParseChallenge(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzVerifyAnswer feeds untrusted answers to Verify: it must never panic,
// and must never accept anything but the challenge signed by the key.
func FuzzVerifyAnswer(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	seed := make([]byte, ed25519.SeedSize)
	priv := ed25519.NewKeyFromSeed(seed)
	pub, _ := NewPublicKey(priv.Public().(ed25519.PublicKey))
	c := Challenge{Nonce: base64.RawURLEncoding.EncodeToString(make([]byte, 32)), Audience: "prod-a3f2e1",
		IssuedAt: now, Expiry: now.Add(time.Minute)}
	good, _ := Answer(priv, c, now)
	f.Add(good)
	f.Add(good[:len(good)-2])
	f.Add("e30.e30.")
	f.Fuzz(func(t *testing.T, answer string) {
		if err := c.Verify(answer, pub, now); err == nil {
			// Anything accepted must carry a valid signature of the key over
			// the nonce: re-check with go-jose directly.
			tok, err := jwt.ParseSigned(answer, []jose.SignatureAlgorithm{jose.EdDSA})
			if err != nil {
				t.Fatalf("accepted an answer go-jose cannot parse: %v", err)
			}
			var mine answerClaims
			if err := tok.Claims(pub.Ed25519(), &mine); err != nil || !hmac.Equal([]byte(mine.Nonce), []byte(c.Nonce)) {
				t.Fatalf("accepted an answer not signed over the nonce: %v", err)
			}
		}
	})
}

func FuzzParseChallenge(f *testing.F) {
	c, _ := NewChallenge("prod-a3f2e1", time.Unix(1_800_000_000, 0))
	f.Add(c.Marshal())
	f.Add([]byte(`{"nonce":"","aud":"","iat":0,"exp":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseChallenge(b)
		if err != nil {
			return
		}
		if d := got.Expiry.Sub(got.IssuedAt); d <= 0 || d > ChallengeTTL || got.Audience == "" {
			t.Fatalf("accepted %+v", got)
		}
		again, err := ParseChallenge(got.Marshal())
		if err != nil || again != got {
			t.Fatalf("round trip of %+v: %+v, %v", got, again, err)
		}
	})
}
