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
	"regexp"
	"strings"
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

var (
	// SPIFFE trust domains: lower-case letters, digits, '.', '-', '_'.
	trustDomainRE = regexp.MustCompile(`^[a-z0-9._-]{1,255}$`)
	// Node IDs, operator names and authority IDs share the DNS-label-like
	// form of DESIGN.md, so every name fits in a host name and a path.
	nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)
)

// ID is one parsed muster SPIFFE ID.
type ID struct {
	TrustDomain string
	Role        Role
	Name        string
}

// ValidTrustDomain checks a trust domain name.
func ValidTrustDomain(td string) error {
	if !trustDomainRE.MatchString(td) {
		return fmt.Errorf("%w: trust domain %q: want 1-255 of a-z 0-9 . - _", ErrInvalid, td)
	}
	return nil
}

// ValidNodeID checks a node ID (also used for operator names).
func ValidNodeID(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: name %q: want 1-63 of a-z 0-9 . -, starting and ending with a letter or digit", ErrInvalid, name)
	}
	return nil
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
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return ID{}, fmt.Errorf("%w: %q: want spiffe://TRUST_DOMAIN/ROLE/NAME", ErrInvalid, s)
	}
	return New(parts[0], Role(parts[1]), parts[2])
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
