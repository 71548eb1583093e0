// Package psk holds the authority-wide bootstrap pre-shared key:
// "muster-psk:" followed by 64 lower-case hex digits (32 random bytes).
package psk

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"strings"
)

// Prefix starts every PSK, so a PSK pasted in the wrong place is recognised.
const Prefix = "muster-psk:"

// ErrMalformed is returned for anything that is not a well-formed PSK. The
// message never repeats the input, which may be a secret.
var ErrMalformed = errors.New("bootstrap PSK is malformed: want muster-psk: followed by 64 lower-case hex digits")

// PSK is one bootstrap pre-shared key.
type PSK struct{ b [32]byte }

// Generate returns a fresh random PSK.
func Generate() (PSK, error) {
	var p PSK
	if _, err := rand.Read(p.b[:]); err != nil {
		return PSK{}, err
	}
	return p, nil
}

// ErrAllZero is returned for a well-formed PSK whose 32 bytes are all
// zero: never a generated one, and a placeholder anyone could guess.
var ErrAllZero = errors.New("bootstrap PSK is invalid: it is all zeros; use the PSK that `muster psk show` prints")

// Parse reads a PSK in its text form, prefix included: a bare hex string
// may be some other secret pasted in the wrong place.
func Parse(s string) (PSK, error) {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return PSK{}, ErrMalformed
	}
	return ParseHex(rest)
}

// ParseHex reads a PSK without its prefix, as carried in the userinfo of a
// joining URI, whose scheme already says what it is.
func ParseHex(s string) (PSK, error) {
	if len(s) != 64 {
		return PSK{}, ErrMalformed
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return PSK{}, ErrMalformed
		}
	}
	var p PSK
	if _, err := hex.Decode(p.b[:], []byte(s)); err != nil {
		return PSK{}, ErrMalformed
	}
	if p.IsZero() {
		return PSK{}, ErrAllZero
	}
	return p, nil
}

// FromBytes rebuilds a PSK from its 32 raw bytes, as decrypted from the store.
func FromBytes(b []byte) (PSK, error) {
	if len(b) != 32 {
		return PSK{}, ErrMalformed
	}
	var p PSK
	copy(p.b[:], b)
	return p, nil
}

// Equal compares in constant time.
func (p PSK) Equal(q PSK) bool { return subtle.ConstantTimeCompare(p.b[:], q.b[:]) == 1 }

// IsZero reports whether p is the zero value, never a generated PSK.
func (p PSK) IsZero() bool { return p == PSK{} }

// Bytes returns the raw 32 bytes, for encryption at rest.
func (p PSK) Bytes() []byte { return append([]byte(nil), p.b[:]...) }

// Reveal returns the text form. It is the only way to print the secret, so
// every place that does is easy to find.
func (p PSK) Reveal() string { return Prefix + hex.EncodeToString(p.b[:]) }

// String keeps the secret out of logs.
func (PSK) String() string { return Prefix + "REDACTED" }

// GoString keeps the secret out of %#v.
func (PSK) GoString() string { return "psk.PSK(REDACTED)" }
