// Package spiffeid parses and builds the SPIFFE IDs that name every muster
// certificate's role: spiffe://TD/authority/AUTHORITY_ID,
// spiffe://TD/agent/NODE_ID and spiffe://TD/admin/NAME. Authorization reads
// the role from here and nowhere else.
package spiffeid

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"
)

// Role is the first path segment of a muster SPIFFE ID.
type Role string

const (
	RoleAuthority Role = "authority"
	RoleAgent     Role = "agent"
	RoleAdmin     Role = "admin"
)

// ErrInvalid is wrapped by every parse and validation failure.
var ErrInvalid = errors.New("invalid SPIFFE ID")

// The names below are checked by byte loops, not regular expressions: a
// renewal checks several (its certificate's ID, the CSR's), and a regexp
// match per check showed in the authority's profile. Each loop accepts
// exactly the language of the expression its comment gives;
// TestValidMatchesRegexp and FuzzValidMatchesRegexp hold them to it.

// validTrustDomain reports whether td matches ^[a-z0-9._-]{1,255}$: SPIFFE
// trust domains, lower-case letters, digits, '.', '-', '_'.
func validTrustDomain(td string) bool {
	if len(td) < 1 || len(td) > 255 {
		return false
	}
	for i := 0; i < len(td); i++ {
		if c := td[i]; !alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validName reports whether name matches
// ^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$: node IDs, operator names and
// authority IDs share the DNS-label-like form of DESIGN.md, so every name
// fits in a host name and a path.
func validName(name string) bool {
	n := len(name)
	if n < 1 || n > 63 || !alnum(name[0]) || !alnum(name[n-1]) {
		return false
	}
	for i := 1; i < n-1; i++ {
		if c := name[i]; !alnum(c) && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// alnum reports whether c is in [a-z0-9]. Every byte of a multi-byte
// UTF-8 sequence (or of invalid UTF-8) is >= 0x80 and so is not.
func alnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// ID is one parsed muster SPIFFE ID.
type ID struct {
	TrustDomain string
	Role        Role
	Name        string
}

// ValidTrustDomain checks a trust domain name.
func ValidTrustDomain(td string) error {
	if !validTrustDomain(td) {
		return fmt.Errorf("%w: trust domain %q: want 1-255 of a-z 0-9 . - _", ErrInvalid, td)
	}
	return nil
}

// NameRule is the form of node IDs and operator names (validName), in
// the words an operator reads.
const NameRule = "1-63 of a-z 0-9 . -, starting and ending with a letter or digit"

// ValidNodeID checks a node ID (also used for operator names).
func ValidNodeID(name string) error {
	if !validName(name) {
		return fmt.Errorf("%w: name %q: want %s", ErrInvalid, name, NameRule)
	}
	return nil
}

// NameError refuses name, given as what (a flag, a field: "node"), when
// it is no node ID or operator name (kind: "node", "operator"): what in
// it breaks NameRule, and the rule. ValidNodeID's error calls it an
// invalid SPIFFE ID, which the operator never typed: the name is one
// segment of muster's SPIFFE IDs, under muster's own rule, stricter than
// SPIFFE's. nil for a valid name.
func NameError(what, kind, name string) error {
	fault := NameFault(name)
	if fault == "" {
		return nil
	}
	return fmt.Errorf("%s %q is not a valid %s name: it %s; %s names are %s", what, name, kind, fault, kind, NameRule)
}

// NameFault says which part of NameRule name breaks, the first found, as
// the end of a sentence about it ("is empty", "has \"_\", which is not one
// of a-z 0-9 . -"); "" for a valid name. An operator told only the rule
// has to find the one capital letter or underscore of a typed name.
func NameFault(name string) string {
	if validName(name) {
		return ""
	}
	n := len(name)
	switch {
	case n == 0:
		return "is empty"
	case n > 63:
		return fmt.Sprintf("is %d bytes long, over 63", n)
	}
	for i := 0; i < n; i++ {
		if c := name[i]; !alnum(c) && c != '.' && c != '-' {
			r, _ := utf8.DecodeRuneInString(name[i:])
			if c >= 'A' && c <= 'Z' {
				return fmt.Sprintf("has the capital %q: names are lower-case", r)
			}
			return fmt.Sprintf("has %q, which is not one of a-z 0-9 . -", r)
		}
	}
	if !alnum(name[0]) {
		return fmt.Sprintf("starts with %q, not a letter or digit", name[0])
	}
	return fmt.Sprintf("ends with %q, not a letter or digit", name[n-1])
}

func validRole(r Role) bool {
	return r == RoleAuthority || r == RoleAgent || r == RoleAdmin
}

// New builds and validates an ID.
func New(td string, role Role, name string) (ID, error) {
	if err := ValidTrustDomain(td); err != nil {
		return ID{}, err
	}
	if !validRole(role) {
		return ID{}, fmt.Errorf("%w: unknown role %q", ErrInvalid, role)
	}
	if err := ValidNodeID(name); err != nil {
		return ID{}, err
	}
	return ID{TrustDomain: td, Role: role, Name: name}, nil
}

// Parse reads spiffe://TD/ROLE/NAME. It accepts only that exact form: no
// port, user info, query, fragment, percent-encoding, or extra segments.
func Parse(s string) (ID, error) {
	rest, ok := strings.CutPrefix(s, "spiffe://")
	if !ok {
		return ID{}, fmt.Errorf("%w: %q does not start with spiffe://", ErrInvalid, s)
	}
	td, rest, ok1 := strings.Cut(rest, "/")
	role, name, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || strings.Contains(name, "/") {
		return ID{}, fmt.Errorf("%w: %q: want spiffe://TRUST_DOMAIN/ROLE/NAME", ErrInvalid, s)
	}
	return New(td, Role(role), name)
}

// String returns the URI form.
func (id ID) String() string {
	if id == (ID{}) {
		return ""
	}
	return "spiffe://" + id.TrustDomain + "/" + string(id.Role) + "/" + id.Name
}

// URL returns the ID as a URI SAN.
func (id ID) URL() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: id.TrustDomain, Path: "/" + string(id.Role) + "/" + id.Name}
}

// FromCertificate returns the SPIFFE ID of a certificate, which must carry
// exactly one URI SAN, as an X.509-SVID does.
func FromCertificate(c *x509.Certificate) (ID, error) {
	if c == nil {
		return ID{}, fmt.Errorf("%w: no certificate", ErrInvalid)
	}
	if len(c.URIs) != 1 {
		return ID{}, fmt.Errorf("%w: certificate has %d URI SANs, want exactly one", ErrInvalid, len(c.URIs))
	}
	return Parse(c.URIs[0].String())
}
