package boundkeypair

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/cryptosigner"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/muster-dev/muster/internal/seal"
)

// JoinStateType is the typ header of a join state document.
const JoinStateType = "muster-join-state"

// JoinState is what the authority signs after each bound-keypair join and
// the agent presents at the next one (DESIGN.md). RecoverySequence is the
// token's sequence after the join; an older one means the keypair is in two
// places.
type JoinState struct {
	Issuer           string // the authority ID
	Token            string // the token's name (aud)
	NodeID           string // sub
	IssuedAt         time.Time
	InstanceID       string
	BoundKey         string // the bound key's fingerprint
	RecoverySequence int64
	RecoveryLimit    int64
	RecoveryMode     string
	// Epoch is the authority epoch of the token's last recovery ("" before
	// any resync window was opened): sequences compare within an epoch.
	Epoch string
	// TokenCreated is the creation of the token the document was signed
	// for (to the microsecond, as the store keeps it; zero in documents
	// signed before it was added). A token deleted and made anew under
	// the same name has another, so a document of the deleted one, which
	// a copy of its key may still hold, is not the new one's (Judge).
	TokenCreated time.Time
}

type joinStateClaims struct {
	InstanceID       string `json:"instance_id"`
	BoundKey         string `json:"bound_key"`
	RecoverySequence int64  `json:"recovery_sequence"`
	RecoveryLimit    int64  `json:"recovery_limit"`
	RecoveryMode     string `json:"recovery_mode"`
	Epoch            string `json:"epoch,omitempty"`
	TokenCreated     int64  `json:"token_created,omitempty"` // Unix microseconds
}

// SigningKey is one version of the authority's join-state key. Old
// versions are kept to verify the documents they signed. Private is an
// Ed25519 key: an ed25519.PrivateKey, or a signer whose key is held in
// custody (a PKCS#11 token's).
type SigningKey struct {
	ID      string // kid
	Private crypto.Signer
}

// NewSigningKey makes a key; its ID is derived from the public key.
func NewSigningKey() (SigningKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return SigningKey{}, err
	}
	return SigningKey{ID: KeyID(pub), Private: priv}, nil
}

// KeyID names a join-state public key: "js-" and the first 16 hex digits of
// its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "js-" + hex.EncodeToString(sum[:8])
}

// Public returns the key's public half.
func (k SigningKey) Public() ed25519.PublicKey { return k.Private.Public().(ed25519.PublicKey) }

// Seal encrypts the key's seed for the store with a sealer of purpose
// seal.InfoJoinState; the key ID is the additional data, so a ciphertext
// moved to another row does not open. (custody.Sealed with that sealer
// and no prefix makes the same ciphertext: its reference is nonce then
// ciphertext.) A key held in custody has no seed to seal.
func (k SigningKey) Seal(s *seal.Sealer) (ciphertext, nonce []byte, err error) {
	priv, ok := k.Private.(ed25519.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("boundkeypair: join-state key %s is held in custody, not sealed", k.ID)
	}
	return s.Seal(priv.Seed(), []byte(k.ID))
}

// OpenSigningKey reverses Seal and checks the key matches its ID.
func OpenSigningKey(s *seal.Sealer, id string, ciphertext, nonce []byte) (SigningKey, error) {
	seed, err := s.Open(ciphertext, nonce, []byte(id))
	if err != nil {
		return SigningKey{}, fmt.Errorf("boundkeypair: join-state key %s: %w", id, err)
	}
	if len(seed) != ed25519.SeedSize {
		return SigningKey{}, fmt.Errorf("boundkeypair: join-state key %s: bad seed", id)
	}
	k := SigningKey{ID: id, Private: ed25519.NewKeyFromSeed(seed)}
	if KeyID(k.Public()) != id {
		return SigningKey{}, fmt.Errorf("boundkeypair: join-state key %s: does not match its ID", id)
	}
	return k, nil
}

// Sign signs s as a join state document.
func (k SigningKey) Sign(s JoinState) (string, error) {
	var key any = k.Private
	if _, ok := k.Private.(ed25519.PrivateKey); !ok {
		key = cryptosigner.Opaque(k.Private)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key},
		(&jose.SignerOptions{}).WithType(JoinStateType).WithHeader(jose.HeaderKey("kid"), k.ID))
	if err != nil {
		return "", err
	}
	std := jwt.Claims{Issuer: s.Issuer, Audience: jwt.Audience{s.Token}, Subject: s.NodeID, IssuedAt: jwt.NewNumericDate(s.IssuedAt)}
	var created int64
	if !s.TokenCreated.IsZero() {
		created = s.TokenCreated.UnixMicro()
	}
	return jwt.Signed(signer).Claims(std).Claims(joinStateClaims{s.InstanceID, s.BoundKey, s.RecoverySequence,
		s.RecoveryLimit, s.RecoveryMode, s.Epoch, created}).Serialize()
}

// ErrJoinStateInvalid: a document that is not a join state this authority
// signed for this token and node. The agent is told join_state_mismatch;
// the wrapped reason goes to the audit record.
var ErrJoinStateInvalid = errors.New("join_state_mismatch")

type invalidState struct{ reason string }

func (e *invalidState) Error() string        { return "join_state_mismatch: " + e.reason }
func (e *invalidState) Is(target error) bool { return target == ErrJoinStateInvalid }

func badState(format string, a ...any) error { return &invalidState{fmt.Sprintf(format, a...)} }

// VerifyJoinState checks doc in this order: size and form; EdDSA only; the
// typ; a known key ID (keys returns the public key of a kid, old ones
// included); the signature; issuer, token and node. Every refusal wraps
// ErrJoinStateInvalid. The sequence is the caller's to judge (Judge).
func VerifyJoinState(doc string, keys func(kid string) (ed25519.PublicKey, bool), issuer, token, nodeID string) (JoinState, error) {
	if len(doc) > MaxMessageBytes {
		return JoinState{}, badState("document is too large")
	}
	tok, err := jwt.ParseSigned(doc, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return JoinState{}, badState("document is not an EdDSA JWT")
	}
	if len(tok.Headers) != 1 || tok.Headers[0].ExtraHeaders[jose.HeaderType] != JoinStateType {
		return JoinState{}, badState("document is not of type %s", JoinStateType)
	}
	pub, ok := keys(tok.Headers[0].KeyID)
	if !ok {
		return JoinState{}, badState("document is signed by an unknown key %.32q", tok.Headers[0].KeyID)
	}
	var (
		std  jwt.Claims
		mine joinStateClaims
	)
	if err := tok.Claims(pub, &std, &mine); err != nil {
		return JoinState{}, badState("signature does not verify")
	}
	switch {
	case std.Issuer != issuer:
		return JoinState{}, badState("document is from another authority")
	case len(std.Audience) != 1 || std.Audience[0] != token:
		return JoinState{}, badState("document is for another token")
	case std.Subject != nodeID:
		return JoinState{}, badState("document is for another node")
	case std.IssuedAt == nil || mine.RecoverySequence < 0 || mine.TokenCreated < 0:
		return JoinState{}, badState("document has malformed claims")
	}
	js := JoinState{Issuer: std.Issuer, Token: token, NodeID: nodeID, IssuedAt: std.IssuedAt.Time(),
		InstanceID: mine.InstanceID, BoundKey: mine.BoundKey, RecoverySequence: mine.RecoverySequence,
		RecoveryLimit: mine.RecoveryLimit, RecoveryMode: mine.RecoveryMode, Epoch: mine.Epoch}
	if mine.TokenCreated > 0 {
		js.TokenCreated = time.UnixMicro(mine.TokenCreated).UTC()
	}
	return js, nil
}

// Settings are the token's recovery settings a join state document
// carries, read without verifying it: for the agent, which holds its own
// document and needs them only to name the muster bot add flags that make
// its token again (the authority verifies every document it is given).
// ok is false for anything that is not a join state's claims.
func Settings(doc string) (limit int64, mode string, ok bool) {
	if len(doc) > MaxMessageBytes {
		return 0, "", false
	}
	tok, err := jwt.ParseSigned(doc, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil || len(tok.Headers) != 1 || tok.Headers[0].ExtraHeaders[jose.HeaderType] != JoinStateType {
		return 0, "", false
	}
	var mine joinStateClaims
	if err := tok.UnsafeClaimsWithoutVerification(&mine); err != nil {
		return 0, "", false
	}
	switch mine.RecoveryMode {
	case ModeStandard, ModeRelaxed, ModeInsecure:
	default:
		return 0, "", false
	}
	if mine.RecoveryLimit < 0 {
		return 0, "", false
	}
	return mine.RecoveryLimit, mine.RecoveryMode, true
}

// BotAddFlags are the muster bot add flags that make a token with these
// settings, those that are not bot add's defaults: a token deleted and
// added again with the defaults would have one recovery (which its first
// join takes), the standard mode and lose client,server.
func BotAddFlags(limit int64, mode string, serverAuth bool) string {
	var b strings.Builder
	if limit != DefaultRecoveryLimit {
		fmt.Fprintf(&b, " --recovery-limit %d", limit)
	}
	if mode != "" && mode != ModeStandard {
		fmt.Fprintf(&b, " --recovery-mode %s", mode)
	}
	if serverAuth {
		b.WriteString(" --svid-usage client,server")
	}
	return b.String()
}
