// Package trustbundle signs and verifies the authority's trust bundle for
// an agent that holds a join token but no CA fingerprint, as kubeadm signs
// cluster-info: the bundle travels as a compact JWS (HS256) whose key only
// the token's holder and the authority know. The agent accepts the root
// only after the signature verifies, and sends its secret only after that.
package trustbundle

import (
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// MaxSize bounds a JWS an agent will parse: a bundle of a few certificates
// is a few KiB.
const MaxSize = 64 << 10

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("trust bundle signature does not verify")

// headerAuthorityID is the protected header that names the authority, so
// the signature covers it.
const headerAuthorityID = "authority_id"

// Bundle is what an agent needs to trust an authority.
type Bundle struct {
	AuthorityID string `json:"authority_id"`
	TrustDomain string `json:"trust_domain"`
	// Roots and Intermediates are PEM certificates; during an
	// intermediate rotation both generations are present.
	Roots         []string `json:"roots"`
	Intermediates []string `json:"intermediates,omitempty"`
	// Endpoints are the advertised addresses of the authority.
	Endpoints []string `json:"endpoints,omitempty"`
}

// Key derives the HS256 key of a token. RFC 7518 asks for a key of at least
// 256 bits and a join token's secret is 16 characters, so the key is
// HKDF-SHA256 of the secret, salted with the token ID: as secret as the
// token, and the right size.
func Key(tokenID string, secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, []byte(tokenID), "muster-trust-bundle-jws", 32)
	if err != nil {
		panic(err) // only a length beyond 255*32 fails
	}
	return k
}

// Sign returns the compact JWS of b, keyed by key (see Key), with kid =
// tokenID, iat and the authority ID in the protected header.
func Sign(b Bundle, tokenID string, key []byte, now time.Time) (string, error) {
	payload, err := json.Marshal(b)
	if err != nil {
		return "", err
	}
	opts := (&jose.SignerOptions{}).
		WithHeader(jose.HeaderKey("kid"), tokenID).
		WithHeader(jose.HeaderKey("iat"), now.Unix()).
		WithHeader(jose.HeaderKey(headerAuthorityID), b.AuthorityID)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: key}, opts)
	if err != nil {
		return "", err
	}
	obj, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return obj.CompactSerialize()
}

// Verified is a bundle whose signature checked, with its roots parsed.
type Verified struct {
	Bundle
	RootCerts []*x509.Certificate
	IssuedAt  time.Time
}

// Verify checks jws against the token's key and returns the bundle. Only
// HS256 is accepted: "none" and every asymmetric algorithm are refused
// before any key is used.
func Verify(jws, tokenID string, key []byte) (*Verified, error) {
	if len(jws) > MaxSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalid, MaxSize)
	}
	obj, err := jose.ParseSignedCompact(jws, []jose.SignatureAlgorithm{jose.HS256})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(obj.Signatures) != 1 {
		return nil, fmt.Errorf("%w: want one signature", ErrInvalid)
	}
	h := obj.Signatures[0].Protected
	if h.KeyID != tokenID {
		return nil, fmt.Errorf("%w: signed for token %q, not %q", ErrInvalid, h.KeyID, tokenID)
	}
	payload, err := obj.Verify(key)
	if err != nil {
		return nil, fmt.Errorf("%w: wrong token secret or tampered bundle", ErrInvalid)
	}
	var v Verified
	if err := json.Unmarshal(payload, &v.Bundle); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrInvalid, err)
	}
	if aid, _ := h.ExtraHeaders[headerAuthorityID].(string); aid != v.AuthorityID {
		return nil, fmt.Errorf("%w: header and payload name different authorities", ErrInvalid)
	}
	if iat, ok := h.ExtraHeaders["iat"].(float64); ok {
		v.IssuedAt = time.Unix(int64(iat), 0)
	}
	if err := spiffeid.ValidNodeID(v.AuthorityID); err != nil {
		return nil, fmt.Errorf("%w: authority ID: %v", ErrInvalid, err)
	}
	if err := spiffeid.ValidTrustDomain(v.TrustDomain); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for _, p := range v.Roots {
		certs, err := ca.ParseCertsPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("%w: root: %v", ErrInvalid, err)
		}
		for _, c := range certs {
			if !c.IsCA || c.CheckSignatureFrom(c) != nil {
				return nil, fmt.Errorf("%w: a root is not a self-signed CA", ErrInvalid)
			}
			v.RootCerts = append(v.RootCerts, c)
		}
	}
	if len(v.RootCerts) == 0 {
		return nil, fmt.Errorf("%w: no root", ErrInvalid)
	}
	return &v, nil
}
