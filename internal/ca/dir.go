package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/muster-dev/muster/internal/atomicfile"
)

// WriteDir writes the hierarchy into dir (created 0700): NAME.crt for every
// certificate, NAME.key (PKCS#8, 0600) for every key, root first.
func (h *Hierarchy) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	write := func(name string, cert *x509.Certificate, key crypto.Signer) error {
		if err := atomicfile.Create(filepath.Join(dir, name+".crt"), EncodeCertPEM(cert), 0o644); err != nil {
			return err
		}
		if _, inFile := key.(*ecdsa.PrivateKey); !inFile {
			// No key, or one held elsewhere (a PKCS#11 token, which
			// keeps it; the store records which object it is).
			return nil
		}
		pemKey, err := EncodeKeyPEM(key)
		if err != nil {
			return err
		}
		return atomicfile.Create(filepath.Join(dir, name+".key"), pemKey, 0o600)
	}
	var rootKey crypto.Signer
	if h.RootKey != nil {
		rootKey = h.RootKey
	}
	if err := write("root", h.Root, rootKey); err != nil {
		return err
	}
	for _, role := range Roles {
		i := h.Issuers[role]
		if err := write(string(role), i.Cert, i.Key); err != nil {
			return err
		}
	}
	return nil
}

// Load reads a hierarchy written by WriteDir and checks it holds together:
// every certificate is signed by the root and every key matches its
// certificate. root.key may be absent (kept offline), and so may an
// intermediate's key when it is held in a token. Key files readable by
// other users are refused.
func Load(dir string) (*Hierarchy, error) {
	root, err := readCert(filepath.Join(dir, "root.crt"))
	if err != nil {
		return nil, err
	}
	if !root.IsCA || root.CheckSignatureFrom(root) != nil {
		return nil, fmt.Errorf("%s is not a self-signed CA certificate", filepath.Join(dir, "root.crt"))
	}
	h := &Hierarchy{Root: root, Issuers: map[Role]*Issuer{}}
	rootKey, err := readKey(filepath.Join(dir, "root.key"), root)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		ek, ok := rootKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%s: root key is not ECDSA", filepath.Join(dir, "root.key"))
		}
		h.RootKey = ek
	}
	for _, role := range Roles {
		path := filepath.Join(dir, string(role)+".crt")
		cert, err := readCert(path)
		if err != nil {
			return nil, err
		}
		if err := cert.CheckSignatureFrom(root); err != nil {
			return nil, fmt.Errorf("%s is not signed by %s", path, filepath.Join(dir, "root.crt"))
		}
		key, err := readKey(filepath.Join(dir, string(role)+".key"), cert)
		switch {
		case errors.Is(err, fs.ErrNotExist) && role != RolePolicy:
			// An intermediate whose key is in a PKCS#11 token: the
			// authority signs with the store's (Key stays nil here).
			key = nil
		case err != nil:
			return nil, err
		}
		h.Issuers[role] = &Issuer{Cert: cert, Key: key}
	}
	return h, nil
}

func readCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCertsPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs[0], nil
}

func readKey(path string, cert *x509.Certificate) (crypto.Signer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key %s is accessible by other users (mode %04o); run chmod 600 on it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := key.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s does not match its certificate", path)
	}
	return key, nil
}
