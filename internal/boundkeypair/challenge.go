package boundkeypair

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Times and sizes of the challenge exchange.
const (
	// ChallengeTTL is how long the authority waits for an answer; DESIGN.md
	// allows at most a minute.
	ChallengeTTL = time.Minute
	// Leeway is the allowance for times set by another machine (DESIGN.md:
	// ±2 minutes).
	Leeway = 2 * time.Minute
	// MaxMessageBytes bounds every challenge, answer and join state
	// document that is parsed.
	MaxMessageBytes = 8 << 10
	// answerType is the typ header of an answer, so that no other JWT the
	// key might sign can stand in for one.
	answerType = "muster-challenge-response"
)

// Challenge is what the authority asks the agent to sign: a fresh nonce for
// one authority, valid until Expiry by the authority's clock.
type Challenge struct {
	Nonce    string    `json:"nonce"` // 32 random bytes, base64url
	Audience string    `json:"aud"`   // the authority ID
	IssuedAt time.Time `json:"-"`
	Expiry   time.Time `json:"-"`
}

type challengeWire struct {
	Nonce    string `json:"nonce"`
	Audience string `json:"aud"`
	IssuedAt int64  `json:"iat"`
	Expiry   int64  `json:"exp"`
}

// NewChallenge returns a challenge for audience issued at now, valid for
// ChallengeTTL.
func NewChallenge(audience string, now time.Time) (Challenge, error) {
	return NewChallengeFor(audience, now, ChallengeTTL)
}

// NewChallengeFor is NewChallenge valid for ttl, which is at least a
// second and at most ChallengeTTL (outside those, ChallengeTTL).
func NewChallengeFor(audience string, now time.Time, ttl time.Duration) (Challenge, error) {
	if ttl < time.Second || ttl > ChallengeTTL {
		ttl = ChallengeTTL
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return Challenge{}, err
	}
	now = now.Truncate(time.Second)
	return Challenge{Nonce: base64.RawURLEncoding.EncodeToString(b), Audience: audience,
		IssuedAt: now, Expiry: now.Add(ttl.Truncate(time.Second))}, nil
}

// Marshal is the challenge as sent to the agent.
func (c Challenge) Marshal() []byte {
	b, _ := json.Marshal(challengeWire{c.Nonce, c.Audience, c.IssuedAt.Unix(), c.Expiry.Unix()})
	return b
}

// ParseChallenge reads a challenge the agent received. The agent checks the
// audience itself (it knows which authority it pinned) before answering.
func ParseChallenge(b []byte) (Challenge, error) {
	if len(b) > MaxMessageBytes {
		return Challenge{}, errors.New("boundkeypair: challenge is too large")
	}
	var w challengeWire
	if err := json.Unmarshal(b, &w); err != nil {
		return Challenge{}, errors.New("boundkeypair: challenge is malformed")
	}
	nonce, err := base64.RawURLEncoding.DecodeString(w.Nonce)
	switch {
	case err != nil || len(nonce) != 32:
		return Challenge{}, errors.New("boundkeypair: challenge nonce is not 32 bytes of base64url")
	case w.Audience == "" || len(w.Audience) > 256:
		return Challenge{}, errors.New("boundkeypair: challenge has no valid audience")
	case w.Expiry <= w.IssuedAt || w.Expiry-w.IssuedAt > int64(ChallengeTTL/time.Second):
		return Challenge{}, fmt.Errorf("boundkeypair: challenge claims a lifetime other than up to %s", ChallengeTTL)
	}
	return Challenge{Nonce: w.Nonce, Audience: w.Audience, IssuedAt: time.Unix(w.IssuedAt, 0), Expiry: time.Unix(w.Expiry, 0)}, nil
}

type answerClaims struct {
	Nonce string `json:"nonce"`
}

// Answer signs c with the agent's key: a compact EdDSA JWT whose audience
// and nonce are the challenge's, issued at now.
func Answer(key ed25519.PrivateKey, c Challenge, now time.Time) (string, error) {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key}, (&jose.SignerOptions{}).WithType(answerType))
	if err != nil {
		return "", err
	}
	std := jwt.Claims{Audience: jwt.Audience{c.Audience}, IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(c.Expiry)}
	return jwt.Signed(signer).Claims(std).Claims(answerClaims{c.Nonce}).Serialize()
}

// ErrChallengeFailed: the answer was not the challenge signed by the bound
// key. Failed says which check, for the audit record only: the caller is
// told challenge_failed and nothing more.
var ErrChallengeFailed = errors.New("challenge_failed")

// Failed is a refused answer.
type Failed struct{ Reason string }

func (f *Failed) Error() string        { return "challenge_failed: " + f.Reason }
func (f *Failed) Is(target error) bool { return target == ErrChallengeFailed }

func failed(format string, a ...any) error { return &Failed{Reason: fmt.Sprintf(format, a...)} }

// Verify checks that answer is c signed by key, at now by the authority's
// clock, in this order: size and form; EdDSA only; the typ; the signature;
// the audience and nonce (constant time); the challenge's own deadline,
// exactly (the authority set it); the agent's iat within Leeway. Every
// refusal wraps ErrChallengeFailed.
func (c Challenge) Verify(answer string, key PublicKey, now time.Time) error {
	if len(answer) > MaxMessageBytes {
		return failed("answer is too large")
	}
	if key.IsZero() {
		return failed("no key is bound")
	}
	tok, err := jwt.ParseSigned(answer, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return failed("answer is not an EdDSA JWT")
	}
	if len(tok.Headers) != 1 || tok.Headers[0].ExtraHeaders[jose.HeaderType] != answerType {
		return failed("answer is not of type %s", answerType)
	}
	var (
		std  jwt.Claims
		mine answerClaims
	)
	if err := tok.Claims(key.Ed25519(), &std, &mine); err != nil {
		return failed("signature does not verify with the bound key")
	}
	switch {
	case len(std.Audience) != 1 || std.Audience[0] != c.Audience:
		return failed("answer is for another authority")
	case subtle.ConstantTimeCompare([]byte(mine.Nonce), []byte(c.Nonce)) != 1:
		return failed("answer is for another challenge")
	case now.After(c.Expiry):
		return failed("challenge expired")
	case std.IssuedAt == nil:
		return failed("answer has no iat")
	}
	if iat := std.IssuedAt.Time(); iat.After(now.Add(Leeway)) || iat.Before(c.IssuedAt.Add(-Leeway)) {
		return failed("answer's iat is outside the clock-skew allowance")
	}
	return nil
}
