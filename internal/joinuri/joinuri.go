// Package joinuri parses and builds joining URIs, the one string an operator
// hands a machine to join with:
//
//	muster+token://ID.SECRET@HOST:PORT?fingerprint=sha256:HEX[&node=NODE]
//	muster+psk://HEX@HOST:PORT?fingerprint=sha256:HEX
//	muster+bound-keypair://NAME[:SECRET]@HOST:PORT?fingerprint=sha256:HEX
//
// With discovery, HOST:PORT is the discovery service's and authority_id=ID
// is added. The user info is percent-encoded (RFC 3986).
package joinuri

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/psk"
	"github.com/muster-dev/muster/internal/spiffeid"
)

// Join methods, as they appear in the scheme.
const (
	MethodToken        = "token"
	MethodPSK          = "psk"
	MethodBoundKeypair = "bound-keypair"
)

// ErrInvalid is wrapped by every parse failure. Messages never repeat the
// secret part of the input.
var ErrInvalid = errors.New("invalid joining URI")

// URI is a parsed joining URI. Exactly one of Token, PSK and KeypairName is
// set, by Method.
type URI struct {
	Method        string
	Token         jointoken.Token
	PSK           psk.PSK
	KeypairName   string
	KeypairSecret string
	// Address is HOST:PORT of the authority, or of discovery when
	// AuthorityID is set.
	Address     string
	Fingerprint string // "" when absent (allowed for tokens only)
	Node        string
	AuthorityID string
	// DiscoveryFingerprint pins discovery's CA when AuthorityID is set;
	// "" trusts the system roots for it.
	DiscoveryFingerprint string
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Parse reads a joining URI.
func Parse(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's errors quote the input, which holds a secret.
		return URI{}, invalid("not a URI")
	}
	var out URI
	switch u.Scheme {
	case "muster+token":
		out.Method = MethodToken
	case "muster+psk":
		out.Method = MethodPSK
	case "muster+bound-keypair":
		out.Method = MethodBoundKeypair
	default:
		return URI{}, invalid("scheme must be muster+token, muster+psk or muster+bound-keypair")
	}
	if u.Opaque != "" || u.User == nil {
		return URI{}, invalid("want %s://CREDENTIAL@HOST:PORT", u.Scheme)
	}
	if (u.Path != "" && u.Path != "/") || u.Fragment != "" || u.RawFragment != "" {
		return URI{}, invalid("no path or fragment allowed")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return URI{}, invalid("want HOST:PORT after the @")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return URI{}, invalid("port must be 1-65535")
	}
	out.Address = u.Host

	name := u.User.Username()
	secret, hasSecret := u.User.Password()
	switch out.Method {
	case MethodToken:
		if hasSecret {
			return URI{}, invalid("a join token has no ':'")
		}
		if out.Token, err = jointoken.Parse(name); err != nil {
			return URI{}, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	case MethodPSK:
		if hasSecret {
			return URI{}, invalid("a PSK has no ':'")
		}
		if out.PSK, err = psk.ParseHex(name); err != nil {
			return URI{}, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	case MethodBoundKeypair:
		if err := spiffeid.NameError("bound-keypair token", "bound-keypair token", name); err != nil {
			return URI{}, invalid("%v", err)
		}
		out.KeypairName, out.KeypairSecret = name, secret
		if hasSecret && secret == "" {
			return URI{}, invalid("empty registration secret after ':'")
		}
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return URI{}, invalid("malformed query")
	}
	for k, v := range q {
		if len(v) != 1 {
			return URI{}, invalid("query parameter %q given %d times", k, len(v))
		}
		switch k {
		case "fingerprint":
			if out.Fingerprint, err = ca.ParseFingerprint(v[0]); err != nil {
				return URI{}, fmt.Errorf("%w: %v", ErrInvalid, err)
			}
		case "node":
			if err := spiffeid.NameError("node", "node", v[0]); err != nil {
				return URI{}, invalid("%v", err)
			}
			out.Node = v[0]
		case "authority_id":
			if err := spiffeid.NameError("authority_id", "authority", v[0]); err != nil {
				return URI{}, invalid("%v", err)
			}
			out.AuthorityID = v[0]
		case "discovery_fingerprint":
			if out.DiscoveryFingerprint, err = ca.ParseFingerprint(v[0]); err != nil {
				return URI{}, fmt.Errorf("%w: discovery_fingerprint: %v", ErrInvalid, err)
			}
		default:
			return URI{}, invalid("unknown query parameter %q", k)
		}
	}
	// Only a token can authenticate the authority by itself (the signed
	// trust bundle); the other methods would send their secret blind.
	if out.Fingerprint == "" && out.Method != MethodToken {
		return URI{}, invalid("a %s URI needs fingerprint=sha256:…", out.Method)
	}
	if out.DiscoveryFingerprint != "" && out.AuthorityID == "" {
		return URI{}, invalid("discovery_fingerprint without authority_id: the address is an authority's, not a discovery's")
	}
	return out, nil
}

// Reveal returns the URI with its secret, for handing to a machine.
func (u URI) Reveal() string {
	var user *url.Userinfo
	switch u.Method {
	case MethodToken:
		user = url.User(u.Token.Reveal())
	case MethodPSK:
		user = url.User(u.PSK.Reveal()[len(psk.Prefix):])
	case MethodBoundKeypair:
		user = url.User(u.KeypairName)
		if u.KeypairSecret != "" {
			user = url.UserPassword(u.KeypairName, u.KeypairSecret)
		}
	}
	// ':' is legal in a query (RFC 3986 section 3.4); keeping it makes the
	// fingerprint read as DESIGN.md and kubeadm write it.
	var q []string
	for _, kv := range [][2]string{{"fingerprint", u.Fingerprint}, {"node", u.Node}, {"authority_id", u.AuthorityID}, {"discovery_fingerprint", u.DiscoveryFingerprint}} {
		if kv[1] != "" {
			q = append(q, kv[0]+"="+strings.ReplaceAll(url.QueryEscape(kv[1]), "%3A", ":"))
		}
	}
	v := url.URL{Scheme: "muster+" + u.Method, User: user, Host: u.Address, RawQuery: strings.Join(q, "&")}
	return v.String()
}

// String names the URI without its secret.
func (u URI) String() string {
	return "muster+" + u.Method + "://REDACTED@" + u.Address
}
