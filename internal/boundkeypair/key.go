// Package boundkeypair holds the rules of muster's bound-keypair join
// method (DESIGN.md, join method 3): the agent's Ed25519 public key in the
// OpenSSH authorized_keys form, the challenge the authority sends and the
// agent's answer (an EdDSA JWT over it), the join state document the
// authority signs after each join (a JWT of type muster-join-state), and
// the recovery rules of the three modes. It knows nothing of gRPC or SQL.
package boundkeypair

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
)

// keyType is the OpenSSH name of an Ed25519 public key.
const keyType = "ssh-ed25519"

// maxKeyText bounds the authorized_keys text that is parsed.
const maxKeyText = 8 << 10

// ErrMalformedKey: text that is not one Ed25519 public key in the
// authorized_keys form. The message never repeats the input.
var ErrMalformedKey = errors.New("boundkeypair: public key is not an ssh-ed25519 key in authorized_keys form")

// PublicKey is an agent's bound Ed25519 public key.
type PublicKey struct{ k ed25519.PublicKey }

// NewPublicKey wraps an Ed25519 public key.
func NewPublicKey(k ed25519.PublicKey) (PublicKey, error) {
	if len(k) != ed25519.PublicKeySize {
		return PublicKey{}, ErrMalformedKey
	}
	return PublicKey{k: bytes.Clone(k)}, nil
}

// ParsePublicKey reads "ssh-ed25519 BASE64 [comment]", as ssh-keygen and
// `muster keypair create` print it. The comment is dropped.
func ParsePublicKey(text string) (PublicKey, error) {
	if len(text) > maxKeyText {
		return PublicKey{}, ErrMalformedKey
	}
	fields := strings.Fields(text)
	if len(fields) < 2 || fields[0] != keyType {
		return PublicKey{}, ErrMalformedKey
	}
	wire, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil {
		return PublicKey{}, ErrMalformedKey
	}
	// The wire form is string("ssh-ed25519") string(32 key bytes), each
	// string a uint32 length and its bytes (RFC 8709, RFC 4253 §6.6).
	name, rest, ok := sshString(wire)
	if !ok || string(name) != keyType {
		return PublicKey{}, ErrMalformedKey
	}
	key, rest, ok := sshString(rest)
	if !ok || len(rest) != 0 || len(key) != ed25519.PublicKeySize {
		return PublicKey{}, ErrMalformedKey
	}
	return PublicKey{k: bytes.Clone(key)}, nil
}

func sshString(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

func (p PublicKey) wire() []byte {
	var b []byte
	for _, s := range [][]byte{[]byte(keyType), p.k} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// IsZero reports whether p holds no key.
func (p PublicKey) IsZero() bool { return len(p.k) == 0 }

// Ed25519 returns the key for signature checks.
func (p PublicKey) Ed25519() ed25519.PublicKey { return p.k }

// String is the canonical authorized_keys form, without a comment: the
// form the store keeps and compares.
func (p PublicKey) String() string {
	if p.IsZero() {
		return ""
	}
	return keyType + " " + base64.StdEncoding.EncodeToString(p.wire())
}

// Fingerprint is OpenSSH's: "SHA256:" and the unpadded base64 of the
// SHA-256 of the wire form, as `ssh-keygen -l` prints it.
func (p PublicKey) Fingerprint() string {
	sum := sha256.Sum256(p.wire())
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// Equal compares two keys; public keys are not secret, but the comparison
// is constant-time anyway so no caller has to think about it.
func (p PublicKey) Equal(q PublicKey) bool { return p.k.Equal(q.k) }
