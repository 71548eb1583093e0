// Package referral holds muster's referral tickets (DESIGN.md, join method
// 2): 60-second EdDSA JWTs that a discovery service hands to an agent for
// one node of one authority, and that the authority checks beside the
// bootstrap PSK. Discovery issues them (Issue) and publishes its keys as a
// JWKS (PublicJWKS); the authority verifies them (Verifier) against a cache
// of that JWKS (KeyCache). Only EdDSA is accepted. Single use (by jti) is
// the authority store's to enforce, so every replica shares it.
package referral

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Lifetimes and allowances.
const (
	// TTL is a ticket's lifetime.
	TTL = 60 * time.Second
	// Leeway is the clock-skew allowance for times set by another machine
	// (DESIGN.md: ±2 minutes).
	Leeway = 2 * time.Minute
	// MaxTicketBytes bounds what is parsed.
	MaxTicketBytes = 4 << 10
)

// Claims are a ticket's claims. Subject and NodeID both name the node, as
// DESIGN.md lists both.
type Claims struct {
	Issuer      string
	AuthorityID string
	NodeID      string
	SourceIP    string
	ID          string // jti
	IssuedAt    time.Time
	Expiry      time.Time
}

type private struct {
	AuthorityID string `json:"authority_id"`
	NodeID      string `json:"node_id"`
	SourceIP    string `json:"source_ip,omitempty"`
}

// NewID returns a random jti: 128 bits, hex.
func NewID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Issue signs c with key (whose key ID is kid) as a compact JWS. The
// audience is the authority ID.
func Issue(key ed25519.PrivateKey, kid string, c Claims) (string, error) {
	if c.ID == "" || c.AuthorityID == "" || c.NodeID == "" || c.Issuer == "" {
		return "", errors.New("referral: issuer, authority, node and jti are required")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return "", err
	}
	std := jwt.Claims{
		Issuer:   c.Issuer,
		Subject:  c.NodeID,
		Audience: jwt.Audience{c.AuthorityID},
		ID:       c.ID,
		IssuedAt: jwt.NewNumericDate(c.IssuedAt),
		Expiry:   jwt.NewNumericDate(c.Expiry),
	}
	return jwt.Signed(signer).Claims(std).Claims(private{c.AuthorityID, c.NodeID, c.SourceIP}).Serialize()
}

// ErrUnknownKey: no key with the ticket's key ID, even after a refresh.
var ErrUnknownKey = errors.New("referral: unknown key ID")

// ErrKeyNotFetched: no key with the ticket's key ID in the keys fetched
// less than RefetchAfter ago, so none was fetched again to look for it.
// The key may be one discovery published since (a replica that reloaded
// later than the one fetched from): worth a retry, not a refusal.
var ErrKeyNotFetched = fmt.Errorf("referral: a key ID not among the keys fetched from discovery, which are fetched again at most every %s", RefetchAfter)

// Invalid is a refused ticket. Reason completes "referral ticket ..." in
// the message the agent sees, so it says which check failed.
type Invalid struct {
	Reason string
	// Expired: the ticket outlived its lifetime (a fresh one cures it
	// unless the clocks are apart, which the refusal says).
	Expired bool
	// UnknownKey: discovery does not publish the ticket's key, even in
	// a JWKS fetched for it: a key revoked (muster discovery rotate-key
	// --revoke-previous) seconds after it signed the ticket, which a
	// fresh ticket, signed by the key discovery signs with now, cures.
	UnknownKey bool
}

func (e *Invalid) Error() string { return "referral ticket " + e.Reason }

func invalid(format string, a ...any) *Invalid { return &Invalid{Reason: fmt.Sprintf(format, a...)} }

// KeySource returns the public key with a key ID, or ErrUnknownKey, or
// ErrKeyNotFetched.
type KeySource interface {
	TicketKey(ctx context.Context, kid string) (ed25519.PublicKey, error)
}

// Verifier checks tickets for one authority.
type Verifier struct {
	Keys KeySource
	// Issuer is the discovery's issuer ("https://HOST:PORT", the address
	// its JWKS is fetched from).
	Issuer      string
	AuthorityID string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Verify checks a ticket for nodeID in this order: size and form; the
// algorithm (EdDSA only); the key ID; the signature; issuer, audience and
// authority; the node; the times (±Leeway). It does not check single use.
// Errors the caller may show are *Invalid; others are the key source's.
func (v *Verifier) Verify(ctx context.Context, token, nodeID string) (Claims, error) {
	if len(token) > MaxTicketBytes {
		return Claims{}, invalid("is too large")
	}
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		if alg := headerAlg(token); alg != "" && alg != string(jose.EdDSA) {
			return Claims{}, invalid("is signed with %.16q; only EdDSA is accepted", alg)
		}
		return Claims{}, invalid("is malformed")
	}
	if len(tok.Headers) != 1 || tok.Headers[0].KeyID == "" {
		return Claims{}, invalid("has no key ID")
	}
	key, err := v.Keys.TicketKey(ctx, tok.Headers[0].KeyID)
	if errors.Is(err, ErrUnknownKey) {
		inv := invalid("is signed by key %.64q, which the discovery does not publish", tok.Headers[0].KeyID)
		inv.UnknownKey = true
		return Claims{}, inv
	}
	if err != nil {
		return Claims{}, err
	}
	var std jwt.Claims
	var priv private
	// Verify first, then decode, so that a signed ticket whose claims do
	// not decode is not reported as a bad signature.
	if err := tok.Claims(key); err != nil {
		return Claims{}, invalid("signature does not verify")
	}
	if err := tok.UnsafeClaimsWithoutVerification(&std, &priv); err != nil {
		return Claims{}, invalid("has malformed claims")
	}
	switch {
	case std.Issuer != v.Issuer:
		// Most often a discovery replica started without the --advertise
		// its peers have, or an authority replica naming discovery by
		// another address than the others (a stale settings file): the
		// same keys sign under another issuer. Name the ways out; the
		// replicas' data directories are not known here, so the setting
		// is named, not a command with a directory to fill in.
		addr := strings.TrimPrefix(v.Issuer, "https://")
		return Claims{}, invalid("is issued by %.64q, not by this authority's discovery %q: join through discovery at %s, "+
			"or start every discovery replica with --advertise %s (or advertise: %s in its discovery.yaml) and restart it, "+
			"or, if the replicas advertise the ticket's issuer, set this authority's discovery.address to it",
			std.Issuer, v.Issuer, addr, addr, addr)
	case len(std.Audience) != 1 || std.Audience[0] != v.AuthorityID || priv.AuthorityID != v.AuthorityID:
		return Claims{}, invalid("is for another authority")
	case nodeID == "" || std.Subject != nodeID || priv.NodeID != nodeID:
		return Claims{}, invalid("names another node")
	case std.ID == "" || len(std.ID) > 128:
		return Claims{}, invalid("has no valid jti")
	case std.Expiry == nil || std.IssuedAt == nil:
		return Claims{}, invalid("lacks iat or exp")
	}
	now := time.Now()
	if v.Now != nil {
		now = v.Now()
	}
	exp, iat := std.Expiry.Time(), std.IssuedAt.Time()
	switch {
	case exp.Sub(iat) > TTL || exp.Before(iat):
		return Claims{}, invalid("claims a lifetime other than %s", TTL)
	case now.After(exp.Add(Leeway)):
		return Claims{}, &Invalid{Reason: "has expired", Expired: true}
	case iat.After(now.Add(Leeway)):
		// Only clocks apart cause this, and a new ticket does not cure it.
		return Claims{}, invalid("is issued in the future (at %s; this authority's clock reads %s): "+
			"discovery's clock is more than %s ahead of this authority's: set both right (NTP)",
			iat.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), Leeway)
	}
	return Claims{Issuer: std.Issuer, AuthorityID: priv.AuthorityID, NodeID: priv.NodeID, SourceIP: priv.SourceIP,
		ID: std.ID, IssuedAt: iat, Expiry: exp}, nil
}

// headerAlg reads the alg of a compact JWS's protected header, to say why a
// ticket was refused; "" if it cannot be read.
func headerAlg(token string) string {
	head, _, ok := strings.Cut(token, ".")
	if !ok {
		return ""
	}
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return ""
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(raw, &h) != nil || len(h.Alg) > 16 {
		return ""
	}
	return h.Alg
}
