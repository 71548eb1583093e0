// Package task holds signed tasks (DESIGN.md "Signed tasks and the signer
// lifecycle"): the envelope the authority signs, its one canonical encoding
// (RFC 8785 JSON of the envelope, signed once with Ed25519 by a signer
// version), and the agent's verifier, which refuses unsigned, expired,
// replayed, mis-targeted and unknown-signer tasks with a typed reason that
// names the signer version.
package task

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/gowebpki/jcs"

	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Built-in task types.
const (
	TypeRotateSigningKey = "node.rotate_signing_key"
	TypeRenewNow         = "node.renew_now"
	TypeReport           = "node.report"
)

// Decoder and envelope limits. A task's lifetime is bounded so the agent's
// replay window, which must remember a task until it expires, is bounded
// too.
const (
	MaxTaskBytes   = 64 << 10
	MaxNodeIDs     = 1024
	MaxLabels      = 32
	MaxParams      = 64
	MaxParamKey    = 128
	MaxParamValue  = 4096
	MaxLifetime    = 24 * time.Hour
	DefaultExpires = 10 * time.Minute
)

// Target selects agents: exactly one of NodeIDs, Labels or All.
type Target struct {
	NodeIDs []string          `json:"node_ids,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	All     bool              `json:"all,omitempty"`
}

// CheckKind checks that t selects by exactly one of node IDs, labels or
// all — what a target must be before anything is resolved from it.
func (t Target) CheckKind() error {
	n := 0
	if t.All {
		n++
	}
	if len(t.NodeIDs) > 0 {
		n++
	}
	if len(t.Labels) > 0 {
		n++
	}
	if n != 1 {
		return malformed("target must be exactly one of node IDs, labels or all")
	}
	return nil
}

// Matches reports whether an agent with this node ID and labels is a
// target.
func (t Target) Matches(nodeID string, labels map[string]string) bool {
	switch {
	case t.All:
		return true
	case len(t.NodeIDs) > 0:
		for _, n := range t.NodeIDs {
			if n == nodeID {
				return true
			}
		}
		return false
	case len(t.Labels) > 0:
		for k, v := range t.Labels {
			if got, ok := labels[k]; !ok || got != v {
				return false
			}
		}
		return true
	}
	return false
}

// Envelope is everything a task's signature covers.
type Envelope struct {
	TaskID          string            `json:"task_id"`
	TaskType        string            `json:"task_type"`
	Target          Target            `json:"target"`
	Params          map[string]string `json:"params"`
	IssuedAt        time.Time         `json:"issued_at"`
	ExpiresAt       time.Time         `json:"expires_at"`
	SignerVersionID string            `json:"signer_version_id"`
}

// signed is the wire form: the envelope and, beside it, the signature over
// the envelope's canonical JSON.
type signed struct {
	Envelope  json.RawMessage `json:"envelope"`
	Signature string          `json:"signature,omitempty"`
}

var (
	typePattern  = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`)
	labelPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
)

// ErrMalformed is returned for an envelope that fails its structural check.
var ErrMalformed = errors.New("task: malformed task")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// Check is the envelope's structural check, made before any signature is
// verified and before the authority signs.
func (e Envelope) Check() error {
	if _, err := uuid.Parse(e.TaskID); err != nil || len(e.TaskID) != 36 {
		return malformed("task ID is not a UUID")
	}
	if !typePattern.MatchString(e.TaskType) {
		return malformed("task type %q", e.TaskType)
	}
	if signer.ValidVersionID(e.SignerVersionID) != nil {
		return malformed("signer version ID")
	}
	if err := e.Target.CheckKind(); err != nil {
		return err
	}
	if len(e.Target.NodeIDs) > MaxNodeIDs || len(e.Target.Labels) > MaxLabels {
		return malformed("target too large")
	}
	for _, id := range e.Target.NodeIDs {
		if spiffeid.ValidNodeID(id) != nil {
			return malformed("target node ID %q", id)
		}
	}
	for k, v := range e.Target.Labels {
		if !labelPattern.MatchString(k) || len(v) > 63 || !utf8.ValidString(v) {
			return malformed("target label %q", k)
		}
	}
	if len(e.Params) > MaxParams {
		return malformed("more than %d params", MaxParams)
	}
	for k, v := range e.Params {
		if k == "" || len(k) > MaxParamKey || len(v) > MaxParamValue || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return malformed("param %q", k)
		}
	}
	if e.IssuedAt.IsZero() || !e.ExpiresAt.After(e.IssuedAt) || e.ExpiresAt.Sub(e.IssuedAt) > MaxLifetime {
		return malformed("expiry must follow the issue time by at most %s", MaxLifetime)
	}
	return nil
}

// Canonical returns the envelope's RFC 8785 form, the bytes that are
// signed.
func (e Envelope) Canonical() ([]byte, error) { return signer.CanonicalJSON(e) }

// Sign checks the envelope and encodes it signed through sign (the signer
// version's custody).
func (e Envelope) Sign(sign func(msg []byte) ([]byte, error)) ([]byte, error) {
	e.IssuedAt, e.ExpiresAt = e.IssuedAt.UTC(), e.ExpiresAt.UTC()
	if err := e.Check(); err != nil {
		return nil, err
	}
	doc, err := e.Canonical()
	if err != nil {
		return nil, err
	}
	sig, err := sign(doc)
	if err != nil {
		return nil, err
	}
	out, err := json.Marshal(signed{Envelope: doc, Signature: base64.RawURLEncoding.EncodeToString(sig)})
	if err == nil && len(out) > MaxTaskBytes {
		// Agents refuse it as malformed: say so before it is queued.
		return nil, malformed("signed, it is %d bytes, more than the %d an agent accepts", len(out), MaxTaskBytes)
	}
	return out, err
}

// decode splits a signed task into its envelope, the envelope's bytes as
// received, and the signature (nil when absent). It checks the
// envelope's structure but verifies nothing.
func decode(data []byte) (Envelope, []byte, []byte, error) {
	if len(data) > MaxTaskBytes {
		return Envelope{}, nil, nil, malformed("larger than %d bytes", MaxTaskBytes)
	}
	var w signed
	if err := signer.DecodeStrict(data, &w); err != nil {
		return Envelope{}, nil, nil, malformed("%v", err)
	}
	var e Envelope
	if err := signer.DecodeStrict(w.Envelope, &e); err != nil {
		return Envelope{}, nil, nil, malformed("%v", err)
	}
	if err := e.Check(); err != nil {
		return e, nil, nil, err
	}
	if w.Signature == "" {
		return e, w.Envelope, nil, nil
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(w.Signature)
	if err != nil || len(sig) != 64 {
		return e, nil, nil, malformed("signature")
	}
	return e, w.Envelope, sig, nil
}

// verifySignature checks sig over the envelope's canonical form. The
// authority sends the envelope in canonical form, so the bytes as received
// are tried first and the RFC 8785 transform, which costs about a third of
// an Ed25519 verification, is paid only for an envelope re-encoded on the
// way.
func verifySignature(pub ed25519.PublicKey, envelope, sig []byte) bool {
	if ed25519.Verify(pub, envelope, sig) {
		return true
	}
	doc, err := jcs.Transform(envelope)
	if err != nil || bytes.Equal(doc, envelope) {
		return false
	}
	return ed25519.Verify(pub, doc, sig)
}

// Decode reads a signed task's envelope without verifying it, for the
// authority's own records. Agents use Verifier.Verify.
func Decode(data []byte) (Envelope, error) {
	e, _, _, err := decode(data)
	return e, err
}
