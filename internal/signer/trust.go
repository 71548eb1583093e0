package signer

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Skew is the allowance for times set by another machine (DESIGN.md: ±2
// minutes), applied when an agent reads the authority's effective and
// grace times against its own clock.
const Skew = 2 * time.Minute

// Errors of an agent accepting a verifier set.
var (
	ErrSetStale     = errors.New("signer: verifier set is not newer than the one held")
	ErrSetUntrusted = errors.New("signer: verifier set is not signed by a key this agent holds as active or staged")
	ErrSetAuthority = errors.New("signer: verifier set is for another authority")
	ErrKeyConflict  = errors.New("signer: a different key is already known under this version ID")
)

// Trust is an agent's view of the signers: the last verifier set it
// accepted, staged keys learnt from rotate tasks since, and the static
// transition list of MUSTER_TASK_SIGNING_PUBKEYS. It reads every time
// against the agent's clock, so an agent that misses a verifier set still
// starts trusting a staged key at its effective time and drops the old
// one when its grace ends. Not safe for concurrent use.
type Trust struct {
	set     VerifierSet
	raw     []byte
	pending []SetKey
	static  []ed25519.PublicKey
}

// NewTrust rebuilds a trust from what an agent persisted: the signed set
// (nil before the first one) and pending staged keys.
func NewTrust(rawSet []byte, pending []SetKey) (*Trust, error) {
	t := &Trust{}
	if rawSet != nil {
		v, err := ParseVerifierSet(rawSet)
		if err != nil {
			return nil, err
		}
		t.set, t.raw = v, rawSet
	}
	for _, k := range pending {
		if err := t.AddStaged(k); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Raw returns the signed set as received, for persistence; nil if none.
func (t *Trust) Raw() []byte { return t.raw }

// Pending returns the staged keys not yet in a set, for persistence.
func (t *Trust) Pending() []SetKey { return append([]SetKey(nil), t.pending...) }

// Version returns the held set's version, 0 before the first.
func (t *Trust) Version() int64 { return t.set.Version }

// MinLeadTime is the lead time the held set names (signer.min_lead_time),
// which a rotate task must respect; DefaultMinLeadTime before the first
// set or when the set does not say.
func (t *Trust) MinLeadTime() time.Duration { return t.set.MinLeadTime() }

// Static reports whether the agent runs on a static verifier list.
func (t *Trust) Static() bool { return len(t.static) > 0 }

// StaticKeys returns the static list's keys.
func (t *Trust) StaticKeys() []ed25519.PublicKey { return t.static }

// SetStatic installs the static list (ParseStaticKeys).
func (t *Trust) SetStatic(keys []ed25519.PublicKey) { t.static = keys }

// ParseStaticKeys reads MUSTER_TASK_SIGNING_PUBKEYS: base64url Ed25519
// public keys separated by commas or white space.
func ParseStaticKeys(s string) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for i, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
		pub, err := ParsePublicKey(f)
		if err != nil {
			return nil, fmt.Errorf("MUSTER_TASK_SIGNING_PUBKEYS entry %d: %w", i+1, err)
		}
		keys = append(keys, pub)
	}
	return keys, nil
}

func (t *Trust) keys() []SetKey {
	out := append([]SetKey(nil), t.set.Keys...)
	return append(out, t.pending...)
}

// StateAt returns a key's state as the agent reads it now: a staged key
// past its effective time counts as active, and the key it replaces as in
// grace until the rotation's grace ends, then as retired. The effective
// time is read without the skew allowance (a staged key is trusted for
// tasks anyway, and one staged with a lead time shorter than the
// allowance must not read as active at once); the end of grace with it.
func (t *Trust) StateAt(versionID string, now time.Time) (SetKey, State, bool) {
	keys := t.keys()
	var k SetKey
	found := false
	for _, c := range keys {
		if c.VersionID == versionID {
			k, found = c, true
		}
	}
	if !found {
		return SetKey{}, "", false
	}
	switch k.State {
	case Staged:
		if !now.Before(k.EffectiveAt) {
			return k, Active, true
		}
		return k, Staged, true
	case Active:
		for _, s := range keys {
			if s.State == Staged && s.Previous == k.VersionID && !now.Before(s.EffectiveAt) {
				if now.After(s.GraceUntil.Add(Skew)) {
					return k, Retired, true
				}
				return k, Grace, true
			}
		}
		return k, Active, true
	case Grace:
		if !k.RetiresAt.IsZero() && now.After(k.RetiresAt.Add(Skew)) {
			return k, Retired, true
		}
		return k, Grace, true
	}
	return k, k.State, true
}

// Verifier returns the public key of versionID if tasks it signs are
// accepted now (staged, active or in grace).
func (t *Trust) Verifier(versionID string, now time.Time) (ed25519.PublicKey, State, bool) {
	k, st, ok := t.StateAt(versionID, now)
	if !ok || !st.Trusted() {
		return nil, st, false
	}
	pub, err := ParsePublicKey(k.PublicKey)
	if err != nil {
		return nil, st, false
	}
	return pub, st, true
}

// Accepted lists the versions whose signatures are accepted now, with
// their states, for the agent's status and heartbeats.
func (t *Trust) Accepted(now time.Time) map[string]State {
	out := map[string]State{}
	for _, k := range t.keys() {
		if _, st, ok := t.StateAt(k.VersionID, now); ok && st.Trusted() {
			out[k.VersionID] = st
		}
	}
	return out
}

// Accept takes a signed verifier set. The first set comes with the join,
// over the channel pinned to the authority's root, and is taken as is;
// later ones must be newer, for the same authority, and signed by a key
// this agent holds as active or staged: in its set as written (or staged
// by a rotate task since), verified with the public key it holds. The
// states are read as the set wrote them, not as the clock would move them
// (StateAt): the authority chose the signer by the same states
// (Signing), and a set's job is to say what happened, e.g. that a staged
// key was discarded before its effective time.
func (t *Trust) Accept(raw []byte, now time.Time) error {
	p, err := parseSigned(raw)
	if err != nil {
		return err
	}
	v := p.set
	if t.raw == nil {
		if _, err := ParseVerifierSet(raw); err != nil {
			return err
		}
	} else {
		if v.AuthorityID != t.set.AuthorityID {
			return ErrSetAuthority
		}
		if v.Version <= t.set.Version {
			return ErrSetStale
		}
		var held SetKey
		found := false
		for _, k := range t.keys() {
			if k.VersionID == p.signer {
				held, found = k, true
			}
		}
		if !found || !held.State.SignsSets() {
			return ErrSetUntrusted
		}
		if !p.verify(held.PublicKey) {
			return ErrSetSignature
		}
		// The new set must not give a key this agent holds another public
		// key: a version ID names one key for good.
		for _, k := range v.Keys {
			for _, h := range t.keys() {
				if h.VersionID == k.VersionID && h.PublicKey != k.PublicKey {
					return ErrKeyConflict
				}
			}
		}
	}
	t.set, t.raw = v, append([]byte(nil), raw...)
	// A pending key the set lists is the set's to state. One it does not
	// list is dropped too when the set was issued after the rotate task
	// that brought it (PublishedAt is the task's issue time): the
	// authority no longer holds it (discarded and pruned, or lost with a
	// restored backup), and an agent that kept it would trust it for
	// tasks and sets for good. A set issued before the task is simply
	// older news and leaves it pending.
	kept := t.pending[:0]
	for _, p := range t.pending {
		if _, in := v.Key(p.VersionID); !in && !v.IssuedAt.After(p.PublishedAt) {
			kept = append(kept, p)
		}
	}
	t.pending = kept
	return nil
}

// AcceptChain takes, in order, the sets the authority kept from the held
// version up to its current one (GetVerifierSet's chain): each is
// accepted by the rule of Accept against the one before, so an agent that
// missed several steps catches up link by link. Links not newer than the
// held set are skipped. It stops at the first link it cannot take and
// returns its error; the links before it stay taken.
func (t *Trust) AcceptChain(raws [][]byte, now time.Time) error {
	for _, raw := range raws {
		if err := t.Accept(raw, now); err != nil && !errors.Is(err, ErrSetStale) {
			return err
		}
	}
	return nil
}

// AddStaged records a staged key learnt from a rotate task. The same key
// again is a no-op; another key under a known version ID is refused.
func (t *Trust) AddStaged(k SetKey) error {
	if err := ValidVersionID(k.VersionID); err != nil {
		return err
	}
	if _, err := ParsePublicKey(k.PublicKey); err != nil {
		return err
	}
	for _, c := range t.keys() {
		if c.VersionID == k.VersionID {
			if c.PublicKey != k.PublicKey {
				return ErrKeyConflict
			}
			return nil
		}
	}
	k.State = Staged
	t.pending = append(t.pending, k)
	return nil
}
