// Package seal holds the authority's storage key and the keys derived from
// it. Every secret muster keeps at rest (PSKs, token secrets, signer keys) is
// encrypted with AES-256-GCM under a key derived by HKDF-SHA256 with one info
// string per purpose, so a key recovered for one purpose opens nothing else.
//
// The storage key is itself derived from the root CA key, so whoever holds
// the root key can always recover it, while the running authority needs only
// the storage key file and never the root key.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/muster-dev/muster/internal/atomicfile"
)

// HKDF info strings, one per purpose. Changing one makes every secret
// sealed under it unreadable.
const (
	InfoStorageKey      = "muster-storage-key"
	InfoPSK             = "muster-psk-encryption"
	InfoToken           = "muster-token-encryption"
	InfoSigner          = "muster-signer-encryption"
	InfoAuditChain      = "muster-audit-chain"
	InfoAuditCheckpoint = "muster-audit-checkpoint"
	// InfoTrustBundleDecoy keys the trust bundles answered for unknown
	// token IDs.
	InfoTrustBundleDecoy = "muster-trust-bundle-decoy"
	// InfoDiscoveryKey seals discovery's referral-ticket signing keys,
	// under discovery's own storage key.
	InfoDiscoveryKey = "muster-discovery-key-encryption"
	// InfoJoinState seals the authority's join-state signing keys (the
	// bound-keypair join state documents).
	InfoJoinState = "muster-join-state-encryption"
	// InfoCA seals the CA intermediates' private keys kept in the store
	// (DESIGN.md "CA lifecycle, revocation and key custody").
	InfoCA = "muster-ca-encryption"
)

// ErrDecrypt is returned for a ciphertext that does not open: a wrong key, a
// wrong purpose, a wrong row, or tampering. The cases are deliberately not
// told apart.
var ErrDecrypt = errors.New("seal: ciphertext does not decrypt")

// StorageKey is the 32-byte root of every at-rest encryption key.
type StorageKey [32]byte

// String keeps the key out of logs and error messages.
func (StorageKey) String() string { return "seal.StorageKey(REDACTED)" }

// GoString keeps the key out of %#v.
func (StorageKey) GoString() string { return "seal.StorageKey(REDACTED)" }

// DeriveStorageKey derives the storage key from the root CA key. The input
// keying material is the private scalar, which never leaves the root key
// file; the derivation is deterministic so the root key can recover it.
func DeriveStorageKey(root *ecdsa.PrivateKey) (StorageKey, error) {
	if root == nil {
		return StorageKey{}, errors.New("seal: no root key")
	}
	secret, err := root.Bytes()
	if err != nil {
		return StorageKey{}, fmt.Errorf("seal: root key: %w", err)
	}
	out, err := hkdf.Key(sha256.New, secret, nil, InfoStorageKey, 32)
	if err != nil {
		return StorageKey{}, err
	}
	var k StorageKey
	copy(k[:], out)
	return k, nil
}

// Derive returns n bytes of key material for one purpose.
func (k StorageKey) Derive(info string, n int) []byte {
	out, err := hkdf.Key(sha256.New, k[:], nil, info, n)
	if err != nil {
		// Only a length beyond 255*32 bytes fails, a programming error.
		panic(fmt.Sprintf("seal: derive %q: %v", info, err))
	}
	return out
}

// Sealer encrypts and decrypts the secrets of one purpose.
type Sealer struct{ aead cipher.AEAD }

// Sealer returns the AES-256-GCM sealer of one purpose.
func (k StorageKey) Sealer(info string) (*Sealer, error) {
	if info == "" {
		return nil, errors.New("seal: empty purpose")
	}
	block, err := aes.NewCipher(k.Derive(info, 32))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext under a fresh random nonce. aad binds the
// ciphertext to its context (a row ID), so a ciphertext copied elsewhere
// does not open.
func (s *Sealer) Seal(plaintext, aad []byte) (ciphertext, nonce []byte, err error) {
	nonce = make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, err
	}
	return s.aead.Seal(nil, nonce, plaintext, aad), nonce, nil
}

// Open decrypts what Seal produced with the same aad.
func (s *Sealer) Open(ciphertext, nonce, aad []byte) ([]byte, error) {
	if len(nonce) != s.aead.NonceSize() {
		return nil, ErrDecrypt
	}
	pt, err := s.aead.Open(nil, nonce, ciphertext, aad)
	if err != nil {
		return nil, ErrDecrypt
	}
	return pt, nil
}

// WriteFile writes the key as 64 hex digits and a newline, mode 0600. It
// refuses to replace an existing file: a lost storage key loses every
// secret sealed under it.
func (k StorageKey) WriteFile(path string) error {
	data := make([]byte, 0, 65)
	data = hex.AppendEncode(data, k[:])
	data = append(data, '\n')
	return atomicfile.Create(path, data, 0o600)
}

// LoadStorageKey reads a key file written by WriteFile. It refuses a file
// other users can read, as ssh does for private keys.
func LoadStorageKey(path string) (StorageKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return StorageKey{}, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return StorageKey{}, fmt.Errorf("storage key %s is accessible by other users (mode %04o); run chmod 600 on it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return StorageKey{}, err
	}
	raw, err := hex.DecodeString(string(bytes.TrimSpace(data)))
	if err != nil || len(raw) != 32 {
		return StorageKey{}, fmt.Errorf("storage key %s is corrupt: want 64 hex digits", path)
	}
	var k StorageKey
	copy(k[:], raw)
	return k, nil
}
