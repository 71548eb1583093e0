package custody

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// PINEnv is the variable the PKCS#11 user PIN is read from when no PIN
// file is given.
const PINEnv = "MUSTER_PKCS11_PIN"

// ErrNoPKCS11Build is returned by OpenPKCS11 in a binary built without
// PKCS#11 support: the default static build (docs/hsm.md).
var ErrNoPKCS11Build = errors.New("custody: pkcs11 custody needs the pkcs11 build of muster (PKCS11=1 scripts/build-binary, i.e. CGO_ENABLED=1 go build -tags pkcs11); this binary is the static one without it (the .deb installs it as /usr/bin/muster-pkcs11; docs/hsm.md)")

// ErrUnavailable: the token cannot be reached now (a lost session or
// token, being re-opened). The call may succeed later.
var ErrUnavailable = errors.New("custody: the PKCS#11 token is unavailable")

// PKCS11URI is the part of an RFC 7512 URI muster reads: which token (by
// label, and optionally manufacturer, model and serial), which object (by
// label and CKA_ID) and, in the query, the module and where the PIN is.
type PKCS11URI struct {
	Token        string
	Manufacturer string
	Model        string
	Serial       string
	Object       string
	ID           []byte
	// Type is the object class named by type= (private, public); muster
	// writes "private" in key references.
	Type string
	// ModulePath is module-path=, the PKCS#11 library to load.
	ModulePath string
	// PINSource is pin-source=, a file holding the PIN (file: URI or path).
	PINSource string
}

// ParsePKCS11URI reads a pkcs11: URI. A PIN given in the URI (pin-value)
// is refused: the URI is kept in configuration, logs and the store.
func ParsePKCS11URI(s string) (PKCS11URI, error) {
	rest, ok := strings.CutPrefix(s, "pkcs11:")
	if !ok {
		return PKCS11URI{}, fmt.Errorf("custody: %q is not a pkcs11: URI (RFC 7512)", s)
	}
	path, query, _ := strings.Cut(rest, "?")
	var u PKCS11URI
	if path != "" {
		for _, attr := range strings.Split(path, ";") {
			k, v, ok := strings.Cut(attr, "=")
			if !ok {
				return PKCS11URI{}, fmt.Errorf("custody: pkcs11 URI attribute %q has no value", attr)
			}
			val, err := url.PathUnescape(v)
			if err != nil {
				return PKCS11URI{}, fmt.Errorf("custody: pkcs11 URI attribute %s: %w", k, err)
			}
			switch k {
			case "token":
				u.Token = val
			case "manufacturer":
				u.Manufacturer = val
			case "model":
				u.Model = val
			case "serial":
				u.Serial = val
			case "object":
				u.Object = val
			case "id":
				u.ID = []byte(val)
			case "type":
				u.Type = val
			case "library-manufacturer", "library-description", "library-version", "slot-description", "slot-manufacturer", "slot-id":
				// Accepted, not used to choose: the token's label does.
			default:
				return PKCS11URI{}, fmt.Errorf("custody: pkcs11 URI attribute %q is not one muster reads (token, manufacturer, model, serial, object, id, type)", k)
			}
		}
	}
	if query != "" {
		for _, attr := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(attr, "=")
			val, err := url.PathUnescape(v)
			if err != nil {
				return PKCS11URI{}, fmt.Errorf("custody: pkcs11 URI query %s: %w", k, err)
			}
			switch k {
			case "module-path":
				u.ModulePath = val
			case "pin-source":
				u.PINSource = strings.TrimPrefix(val, "file:")
			case "pin-value":
				return PKCS11URI{}, fmt.Errorf("custody: a PIN in the pkcs11 URI (pin-value) is refused: give a PIN file (pin-source or --pkcs11-pin-file) or %s", PINEnv)
			default:
				return PKCS11URI{}, fmt.Errorf("custody: pkcs11 URI query attribute %q is not one muster reads (module-path, pin-source)", k)
			}
		}
	}
	if u.Token == "" {
		return PKCS11URI{}, errors.New("custody: the pkcs11 URI names no token (token=LABEL)")
	}
	return u, nil
}

// String writes the URI back, every value percent-encoded outside
// RFC 3986's unreserved characters, the ID always byte by byte.
func (u PKCS11URI) String() string {
	var b strings.Builder
	b.WriteString("pkcs11:")
	sep := ""
	add := func(k, v string, all bool) {
		if v == "" {
			return
		}
		b.WriteString(sep + k + "=" + pctEncode([]byte(v), all))
		sep = ";"
	}
	add("token", u.Token, false)
	add("manufacturer", u.Manufacturer, false)
	add("model", u.Model, false)
	add("serial", u.Serial, false)
	add("object", u.Object, false)
	add("id", string(u.ID), true)
	add("type", u.Type, false)
	sep = "?"
	for _, q := range [][2]string{{"module-path", u.ModulePath}, {"pin-source", u.PINSource}} {
		if q[1] != "" {
			b.WriteString(sep + q[0] + "=" + pctEncode([]byte(q[1]), false))
			sep = "&"
		}
	}
	return b.String()
}

func pctEncode(v []byte, all bool) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for _, c := range v {
		unreserved := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
		if unreserved && !all {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// IsPKCS11Ref reports whether a stored key reference names a token
// object rather than holding a sealed key.
func IsPKCS11Ref(ref []byte) bool { return bytes.HasPrefix(ref, []byte("pkcs11:")) }

// PKCS11Config opens a token.
type PKCS11Config struct {
	// URI names the token (RFC 7512); its module-path and pin-source are
	// used when Module and PINFile are empty.
	URI string
	// Module is the PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so.
	Module string
	// PINFile holds the user PIN (one line, mode 0600 or stricter). When
	// neither it nor the URI's pin-source is given, MUSTER_PKCS11_PIN is.
	PINFile string
	// Sessions bounds the sessions open at once, which is how many
	// signatures can be made in parallel; 0 means DefaultSessions.
	Sessions int
}

// DefaultSessions is the session pool's size unless configured.
const DefaultSessions = 8

// ReadPIN finds the PIN: the file (refused when other users can read
// it), else the variable, which it then removes from this process's
// environment: a process started from here (a helper a vendor's module
// runs, say) would inherit it. The token keeps the PIN it read, for its
// re-opens.
func (c PKCS11Config) ReadPIN(u PKCS11URI) (string, error) {
	file := c.PINFile
	if file == "" {
		file = u.PINSource
	}
	if file == "" {
		pin, ok := os.LookupEnv(PINEnv)
		if !ok || pin == "" {
			return "", fmt.Errorf("custody: no PKCS#11 PIN: give a PIN file (--pkcs11-pin-file, mode 0600) or set %s", PINEnv)
		}
		if err := os.Unsetenv(PINEnv); err != nil {
			return "", fmt.Errorf("custody: removing %s from the environment: %w", PINEnv, err)
		}
		return pin, nil
	}
	fi, err := os.Stat(file)
	if err != nil {
		return "", fmt.Errorf("custody: PKCS#11 PIN file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("custody: PKCS#11 PIN file %s is accessible by other users (mode %04o); run chmod 600 on it", file, fi.Mode().Perm())
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("custody: PKCS#11 PIN file: %w", err)
	}
	pin := strings.TrimRight(string(data), "\r\n")
	if pin == "" {
		return "", fmt.Errorf("custody: PKCS#11 PIN file %s is empty", file)
	}
	return pin, nil
}
