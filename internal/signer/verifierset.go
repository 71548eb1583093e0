package signer

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// SetType names the verifier set document inside it, so a signature over
// another document (a task) is never read as a verifier set.
const SetType = "muster-verifier-set"

// Decoder limits: a verifier set holds a handful of keys; anything larger
// is refused before it is parsed further.
const (
	MaxSetBytes = 64 << 10
	MaxSetKeys  = 64
)

// SetKey is one signer as agents see it: never the private half.
type SetKey struct {
	VersionID   string    `json:"version_id"`
	PublicKey   string    `json:"public_key"`
	State       State     `json:"state"`
	PublishedAt time.Time `json:"published_at"`
	EffectiveAt time.Time `json:"effective_at,omitzero"`
	GraceUntil  time.Time `json:"grace_until,omitzero"`
	RetiresAt   time.Time `json:"retires_at,omitzero"`
	EndedAt     time.Time `json:"ended_at,omitzero"`
	Previous    string    `json:"previous,omitempty"`
}

// VerifierSet is the document of the keys agents accept, revocations
// included. Version only goes up: the store advances it with every signer
// change.
type VerifierSet struct {
	Type        string    `json:"type"`
	AuthorityID string    `json:"authority_id"`
	Version     int64     `json:"version"`
	IssuedAt    time.Time `json:"issued_at"`
	Keys        []SetKey  `json:"keys"`
	// MinLeadTimeSeconds is the authority's signer.min_lead_time: agents
	// refuse a rotate task whose effective time is less than this after
	// its issue time. 0 (absent): DefaultMinLeadTime.
	MinLeadTimeSeconds int64 `json:"min_lead_time_seconds,omitempty"`
}

// MinLeadTime is the set's signer.min_lead_time, DefaultMinLeadTime when
// the set does not say.
func (v VerifierSet) MinLeadTime() time.Duration {
	if v.MinLeadTimeSeconds <= 0 {
		return DefaultMinLeadTime
	}
	return time.Duration(v.MinLeadTimeSeconds) * time.Second
}

// signedSet is the wire form: the set as canonical JSON, and one Ed25519
// signature over exactly those bytes by SignerVersionID — a key that was
// active or staged in the previous set and is active or staged in this one
// (Signing), so every agent holding the previous set can take this one.
type signedSet struct {
	Set             json.RawMessage `json:"set"`
	SignerVersionID string          `json:"signer_version_id"`
	Signature       string          `json:"signature"`
}

// ErrSetMalformed is returned for a verifier set that fails its structural
// check; ErrSetSignature for one whose signature does not verify.
var (
	ErrSetMalformed = errors.New("signer: malformed verifier set")
	ErrSetSignature = errors.New("signer: verifier set signature does not verify")
)

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrSetMalformed, fmt.Sprintf(format, a...))
}

// NewVerifierSet builds the set agents get from the store's signers.
func NewVerifierSet(authorityID string, version int64, signers []Signer, now time.Time, minLead time.Duration) VerifierSet {
	v := VerifierSet{Type: SetType, AuthorityID: authorityID, Version: version, IssuedAt: now.UTC(), Keys: []SetKey{}}
	if minLead > 0 && minLead != DefaultMinLeadTime {
		// Said only when it is not the default, which a set without it
		// means: agents of the release before, which refuse fields they
		// do not know, keep taking sets of an authority on the default.
		v.MinLeadTimeSeconds = int64(minLead / time.Second)
	}
	// The set is bounded (MaxSetKeys): the live keys always, and of the
	// retired and revoked ones the most recently ended. An agent trusts no
	// key a set does not list, so dropping an old ended key changes
	// nothing it accepts.
	ended := 0
	for _, s := range signers {
		if !s.State.Trusted() {
			ended++
		}
	}
	drop := map[string]bool{}
	if over := len(signers) - MaxSetKeys; over > 0 && ended > 0 {
		old := make([]Signer, 0, ended)
		for _, s := range signers {
			if !s.State.Trusted() {
				old = append(old, s)
			}
		}
		slices.SortStableFunc(old, func(a, b Signer) int { return a.EndedAt.Compare(b.EndedAt) })
		for _, s := range old[:min(over, len(old))] {
			drop[s.VersionID] = true
		}
	}
	for _, s := range signers {
		if drop[s.VersionID] {
			continue
		}
		v.Keys = append(v.Keys, SetKey{
			VersionID: s.VersionID, PublicKey: EncodePublicKey(s.PublicKey), State: s.State,
			PublishedAt: s.PublishedAt.UTC(), EffectiveAt: s.EffectiveAt.UTC(), GraceUntil: s.GraceUntil.UTC(),
			RetiresAt: s.RetiresAt.UTC(), EndedAt: s.EndedAt.UTC(), Previous: s.Previous,
		})
	}
	return v
}

// Canonical returns the set's RFC 8785 form, the bytes that are signed.
func (v VerifierSet) Canonical() ([]byte, error) { return CanonicalJSON(v) }

// CanonicalJSON is the RFC 8785 form of v's JSON encoding: the bytes every
// signed document of this package and of package task is signed over.
func CanonicalJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(raw)
}

// Sign encodes the set signed by the key signerID (Signing chooses it),
// through sign (custody). The signer must be active or staged in the set.
func (v VerifierSet) Sign(signerID string, sign func(msg []byte) ([]byte, error)) ([]byte, error) {
	if err := v.check(); err != nil {
		return nil, err
	}
	if k, ok := v.Key(signerID); !ok || !k.State.SignsSets() {
		return nil, fmt.Errorf("signer: %s is not active or staged in verifier set %d and may not sign it", signerID, v.Version)
	}
	doc, err := v.Canonical()
	if err != nil {
		return nil, err
	}
	sig, err := sign(doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(signedSet{Set: doc, SignerVersionID: signerID, Signature: base64.RawURLEncoding.EncodeToString(sig)})
}

// SignsSets reports whether a key in state s may sign a verifier set:
// active or staged. Grace, retired and revoked keys sign nothing, so a
// leaked old key cannot rewrite trust.
func (s State) SignsSets() bool { return s == Active || s == Staged }

// Signing chooses the key that signs the set made by a step from prev (the
// states of the previous set; nil when it is not known) to next: a key
// that is active or staged in both, so every agent holding the previous
// set holds the signer as active or staged, and the signer is not one the
// step ended. The new active key when it qualifies (an activation, forced
// or not, and a revocation of the active key are signed by the successor);
// else the other one (a rollback inside grace is signed by the key that was
// active, now staged again). Without prev, the active key.
func Signing(prev map[string]State, next []Signer) (Signer, error) {
	active, ok := ActiveOf(next)
	if !ok {
		return Signer{}, ErrNoActive
	}
	if prev == nil || prev[active.VersionID].SignsSets() {
		return active, nil
	}
	for _, s := range next {
		if s.State.SignsSets() && prev[s.VersionID].SignsSets() {
			return s, nil
		}
	}
	return Signer{}, fmt.Errorf("signer: no key is active or staged in both verifier sets; agents holding the previous set could not take the next")
}

// Active returns the set's active key.
func (v VerifierSet) Active() (SetKey, bool) {
	for _, k := range v.Keys {
		if k.State == Active {
			return k, true
		}
	}
	return SetKey{}, false
}

// Key returns the key of one version.
func (v VerifierSet) Key(versionID string) (SetKey, bool) {
	for _, k := range v.Keys {
		if k.VersionID == versionID {
			return k, true
		}
	}
	return SetKey{}, false
}

// check is the structural check: type, version, bounded keys, each key
// well-formed and unique, exactly one active, at most one staged and one
// in grace.
func (v VerifierSet) check() error {
	if v.Type != SetType {
		return malformed("type %q", v.Type)
	}
	if v.Version <= 0 {
		return malformed("version must be positive")
	}
	if !utf8.ValidString(v.AuthorityID) || v.AuthorityID == "" || len(v.AuthorityID) > 128 {
		return malformed("authority ID")
	}
	if len(v.Keys) > MaxSetKeys {
		return malformed("more than %d keys", MaxSetKeys)
	}
	seen := map[string]bool{}
	count := map[State]int{}
	for _, k := range v.Keys {
		if ValidVersionID(k.VersionID) != nil || seen[k.VersionID] {
			return malformed("version ID %q missing, malformed or repeated", k.VersionID)
		}
		seen[k.VersionID] = true
		if !k.State.Valid() {
			return malformed("key %s: state %q", k.VersionID, k.State)
		}
		if k.Previous != "" && ValidVersionID(k.Previous) != nil {
			return malformed("key %s: previous version ID", k.VersionID)
		}
		if _, err := ParsePublicKey(k.PublicKey); err != nil {
			return malformed("key %s: public key", k.VersionID)
		}
		count[k.State]++
	}
	if count[Active] != 1 || count[Staged] > 1 || count[Grace] > 1 {
		return malformed("want one active key, at most one staged and one in grace")
	}
	return nil
}

// ParseVerifierSet decodes a signed verifier set, checks its structure and
// that it is signed by a key it lists as active or staged, and returns it.
// Whether that key is one the caller trusts is the caller's decision
// (Trust.Accept).
func ParseVerifierSet(data []byte) (VerifierSet, error) {
	p, err := parseSigned(data)
	if err != nil {
		return VerifierSet{}, err
	}
	k, ok := p.set.Key(p.signer)
	if !ok || !k.State.SignsSets() {
		return VerifierSet{}, malformed("signed by %q, not a key it lists as active or staged", p.signer)
	}
	if !p.verify(k.PublicKey) {
		return VerifierSet{}, ErrSetSignature
	}
	return p.set, nil
}

// parsedSet is a decoded signed set whose signature is not checked yet.
type parsedSet struct {
	set    VerifierSet
	signer string
	doc    []byte
	sig    []byte
}

// verify checks the signature with pub (the text form).
func (p parsedSet) verify(pub string) bool {
	key, err := ParsePublicKey(pub)
	return err == nil && ed25519.Verify(key, p.doc, p.sig)
}

func parseSigned(data []byte) (parsedSet, error) {
	if len(data) > MaxSetBytes {
		return parsedSet{}, malformed("larger than %d bytes", MaxSetBytes)
	}
	var w signedSet
	if err := DecodeStrict(data, &w); err != nil {
		return parsedSet{}, malformed("%v", err)
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(w.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return parsedSet{}, malformed("signature")
	}
	var v VerifierSet
	if err := DecodeStrict(w.Set, &v); err != nil {
		return parsedSet{}, malformed("%v", err)
	}
	if err := v.check(); err != nil {
		return parsedSet{}, err
	}
	if v.MinLeadTimeSeconds < 0 {
		return parsedSet{}, malformed("negative min_lead_time_seconds")
	}
	if ValidVersionID(w.SignerVersionID) != nil {
		return parsedSet{}, malformed("signer version ID")
	}
	doc, err := jcs.Transform(w.Set)
	if err != nil {
		return parsedSet{}, malformed("canonical form: %v", err)
	}
	return parsedSet{set: v, signer: w.SignerVersionID, doc: doc, sig: sig}, nil
}

// DecodeStrict decodes one JSON value of a signed document, refusing
// invalid UTF-8 (which json would replace, letting two texts share one
// canonical form), unknown fields and trailing data. Package task decodes
// its envelopes with it too.
func DecodeStrict(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errors.New("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) != 0 {
		return errors.New("trailing data")
	}
	return nil
}
