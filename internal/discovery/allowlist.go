package discovery

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/muster-dev/muster/internal/ca"
)

// An authority ID carries only 24 bits of its root's fingerprint, so a
// matching key takes about 2^24 tries to grind. Were the first registration
// of an ID enough to lock it, anyone could lock an authority out of a
// discovery by registering its ID first. The allow-list closes that: a
// discovery accepts a registration only for an authority ID it lists, and
// only under the full root fingerprint listed for it.

// AllowEntry names an authority a discovery accepts, pinned to the
// fingerprint of its root (what muster init prints as ca_fingerprint).
type AllowEntry struct {
	AuthorityID string `yaml:"authority_id"`
	Fingerprint string `yaml:"ca_fingerprint"`
}

// String is the entry as --allow-authority takes it: ID=sha256:HEX.
func (e AllowEntry) String() string { return e.AuthorityID + "=" + e.Fingerprint }

// ParseAllowEntry parses "ID=sha256:HEX" (the form of --allow-authority)
// and checks it as Canonical does.
func ParseAllowEntry(s string) (AllowEntry, error) {
	id, fp, ok := strings.Cut(s, "=")
	if !ok {
		return AllowEntry{}, fmt.Errorf("discovery: allowed authority %q: want AUTHORITY_ID=sha256:HEX", s)
	}
	return AllowEntry{AuthorityID: id, Fingerprint: fp}.Canonical()
}

// Canonical checks an entry and returns it with its fingerprint in lower
// case: the authority ID has the form NAME-HEX6 and names that
// fingerprint, so a fingerprint of another root (discovery's own, say) is
// refused rather than silently never matching.
func (e AllowEntry) Canonical() (AllowEntry, error) {
	if err := ValidAuthorityID(e.AuthorityID); err != nil {
		return AllowEntry{}, err
	}
	fp, err := ca.ParseFingerprint(e.Fingerprint)
	if err != nil {
		return AllowEntry{}, fmt.Errorf("discovery: allowed authority %s: %w", e.AuthorityID, err)
	}
	if err := CheckAuthorityID(e.AuthorityID, fp); err != nil {
		return AllowEntry{}, fmt.Errorf("discovery: allowed authority %s: the fingerprint %s is not its root's (the ID would be %s): use the ca_fingerprint muster init printed for it",
			e.AuthorityID, fp, ca.AuthorityID(e.AuthorityID[:strings.LastIndexByte(e.AuthorityID, '-')], fp))
	}
	return AllowEntry{AuthorityID: e.AuthorityID, Fingerprint: fp}, nil
}

// ValidAuthorityID checks the form NAME-HEX6 of an authority ID, the hex
// in lower case, as muster init makes it.
func ValidAuthorityID(id string) error {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != 6 || ca.ValidName(id[:i]) != nil || strings.ToLower(id[i+1:]) != id[i+1:] {
		return fmt.Errorf("discovery: authority ID %q is not NAME-HEX6 (as muster init prints it)", id)
	}
	if _, err := hex.DecodeString(id[i+1:]); err != nil {
		return fmt.Errorf("discovery: authority ID %q is not NAME-HEX6 (as muster init prints it)", id)
	}
	return nil
}

// Allowlist is the rule a discovery applies to registrations: an authority
// ID it lists registers only under the root fingerprint listed for it; an
// ID it does not list is refused, unless the list is open, in which case
// the first registration that verifies locks the ID (the store's rule).
// The zero value, and a nil *Allowlist, refuse every registration. It is
// not changed after NewAllowlist, so it is safe for concurrent use.
type Allowlist struct {
	open  bool
	roots map[string]string // authority ID -> fingerprint
}

// NewAllowlist checks entries (Canonical) and builds the list. An ID
// listed twice must name one fingerprint both times: an authority ID has
// one root.
func NewAllowlist(entries []AllowEntry, open bool) (*Allowlist, error) {
	a := &Allowlist{open: open, roots: make(map[string]string, len(entries))}
	for _, e := range entries {
		c, err := e.Canonical()
		if err != nil {
			return nil, err
		}
		if prev, ok := a.roots[c.AuthorityID]; ok && prev != c.Fingerprint {
			return nil, fmt.Errorf("discovery: authority %s is allowed twice, with %s and %s: an authority ID has one root", c.AuthorityID, prev, c.Fingerprint)
		}
		a.roots[c.AuthorityID] = c.Fingerprint
	}
	return a, nil
}

// Open reports whether authority IDs the list does not name are accepted.
func (a *Allowlist) Open() bool { return a != nil && a.open }

// Entries returns the listed authorities, by authority ID.
func (a *Allowlist) Entries() []AllowEntry {
	if a == nil {
		return nil
	}
	out := make([]AllowEntry, 0, len(a.roots))
	for id, fp := range a.roots {
		out = append(out, AllowEntry{AuthorityID: id, Fingerprint: fp})
	}
	slices.SortFunc(out, func(x, y AllowEntry) int { return strings.Compare(x.AuthorityID, y.AuthorityID) })
	return out
}

// ErrNotAllowed is what every *NotAllowedError matches with errors.Is.
var ErrNotAllowed = errors.New("discovery: authority not allowed")

// NotAllowedError is a registration the allow-list refuses. Allowed is
// the fingerprint listed for the authority ID, "" when the ID is not
// listed; Fingerprint is the root the registration is signed under, ""
// when the refusal came before it was known (CheckID).
type NotAllowedError struct {
	AuthorityID string
	Fingerprint string
	Allowed     string
}

func (e *NotAllowedError) Error() string {
	if e.Allowed == "" {
		return fmt.Sprintf("discovery: authority ID %s is not on the allow-list", e.AuthorityID)
	}
	return fmt.Sprintf("discovery: authority ID %s is allowed with root fingerprint %s only; this registration is signed under %s",
		e.AuthorityID, e.Allowed, e.Fingerprint)
}

// Is makes errors.Is(err, ErrNotAllowed) hold.
func (e *NotAllowedError) Is(target error) bool { return target == ErrNotAllowed }

// CheckID refuses an authority ID the list does not name, unless the list
// is open: the part of Check that needs no verified registration, so an
// unlisted ID is refused before any signature is checked.
func (a *Allowlist) CheckID(authorityID string) error {
	if a != nil {
		if _, ok := a.roots[authorityID]; ok || a.open {
			return nil
		}
	}
	return &NotAllowedError{AuthorityID: authorityID}
}

// Check applies the list to an authority ID and the fingerprint of the
// root a registration of it verified under: nil if the ID is listed with
// that fingerprint, or not listed and the list open; a *NotAllowedError
// otherwise.
func (a *Allowlist) Check(authorityID, fingerprint string) error {
	if a.CheckID(authorityID) != nil {
		return &NotAllowedError{AuthorityID: authorityID, Fingerprint: fingerprint}
	}
	if want, ok := a.roots[authorityID]; ok && want != fingerprint {
		return &NotAllowedError{AuthorityID: authorityID, Fingerprint: fingerprint, Allowed: want}
	}
	return nil
}
