package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

// BoundKeyFile is the agent's bound Ed25519 key (PKCS#8 PEM, 0600): the
// proof of a bound-keypair join.
func (d Dir) BoundKeyFile() string { return d.path("keys", "bound.key") }

// ErrBoundKeyExists: the data directory already holds a bound key, which
// a new one would orphan.
var ErrBoundKeyExists = errors.New("agent: the data directory already holds a bound key (keys/bound.key)")

// CreateBoundKey makes the bound key of a static binding and returns its
// public half. It never replaces an existing key.
func CreateBoundKey(d Dir) (boundkeypair.PublicKey, error) {
	if err := d.ensure(); err != nil {
		return boundkeypair.PublicKey{}, err
	}
	if _, err := os.Stat(d.BoundKeyFile()); err == nil {
		return boundkeypair.PublicKey{}, ErrBoundKeyExists
	} else if !errors.Is(err, fs.ErrNotExist) {
		return boundkeypair.PublicKey{}, fmt.Errorf("agent: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return boundkeypair.PublicKey{}, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return boundkeypair.PublicKey{}, err
	}
	if err := atomicfile.Write(d.BoundKeyFile(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return boundkeypair.PublicKey{}, fmt.Errorf("agent: %w", err)
	}
	return boundkeypair.NewPublicKey(pub)
}

// LoadBoundKey reads the bound key; fs.ErrNotExist if there is none.
func LoadBoundKey(d Dir) (ed25519.PrivateKey, error) { return loadEd25519(d.BoundKeyFile()) }

// loadEd25519 reads a PKCS#8 PEM Ed25519 key; fs.ErrNotExist if there is
// none.
func loadEd25519(path string) (ed25519.PrivateKey, error) {
	data, err := readSmall(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("agent: %s is not a PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("agent: %s is not an Ed25519 key", path)
	}
	return priv, nil
}
