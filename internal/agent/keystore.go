package agent

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
)

// pendingKey returns the key in keys/pending.key, or, if there is none and
// create is set, generates a P-256 key and persists it before returning it.
func (d Dir) pendingKey(create bool) (crypto.Signer, error) {
	data, err := readSmall(d.PendingKeyFile())
	switch {
	case err == nil:
		k, err := ca.ParseKeyPEM(data)
		if err != nil {
			return nil, fmt.Errorf("agent: %s cannot be used (%v): remove it", d.PendingKeyFile(), err)
		}
		return k, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("agent: %w", err)
	case !create:
		return nil, nil
	}
	if err := d.ensure(); err != nil {
		return nil, err
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	pemKey, err := ca.EncodeKeyPEM(k)
	if err != nil {
		return nil, err
	}
	if err := identity.WriteFileAtomic(d.PendingKeyFile(), pemKey, 0o600); err != nil {
		return nil, fmt.Errorf("agent: persisting the new key: %w", err)
	}
	return k, nil
}

func (d Dir) removePendingKey() error {
	if err := os.Remove(d.PendingKeyFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("agent: %w", err)
	}
	return atomicfile.SyncDir(d.path("keys"))
}

// LoadIdentity reads the certificate, its key and the pinned roots. It
// completes a renewal interrupted between writing the certificate and its
// key: if certs/agent.key does not match the certificate but the pending
// key does, the pending key is the certificate's.
func (d Dir) LoadIdentity() (*identity.Identity, error) {
	certPEM, err := readSmall(d.CertFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoIdentity
	} else if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	chain, err := ca.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %v", d.CertFile(), err)
	}
	caPEM, err := readSmall(d.CAFile())
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	roots, err := ca.ParseCertsPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %v", d.CAFile(), err)
	}
	id := &identity.Identity{Chain: chain, Roots: roots}
	if fi, err := os.Stat(d.KeyFile()); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("agent: %s is readable by other users (mode %v): run chmod 600 on it", d.KeyFile(), fi.Mode().Perm())
	}
	keyPEM, err := readSmall(d.KeyFile())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err == nil {
		k, err := ca.ParseKeyPEM(keyPEM)
		if err != nil {
			return nil, fmt.Errorf("agent: %s: %v", d.KeyFile(), err)
		}
		if identity.SamePublicKey(k.Public(), chain[0].PublicKey) {
			id.Key = k
		}
	}
	if id.Key == nil {
		pk, err := d.pendingKey(false)
		if err != nil {
			return nil, err
		}
		if pk == nil || !identity.SamePublicKey(pk.Public(), chain[0].PublicKey) {
			return nil, fmt.Errorf("agent: %s does not match %s: join again with --force", d.KeyFile(), d.CertFile())
		}
		id.Key = pk
	}
	return id, nil
}

// repair finishes what a crash may have left half done: a certificate
// whose key is still the pending key, a pending key already certified, or
// a keystore that does not hold the current certificate.
func (d Dir) repair(id *identity.Identity) error {
	keyPEM, _ := readSmall(d.KeyFile())
	cur, _ := ca.ParseKeyPEM(keyPEM)
	if cur == nil || !identity.SamePublicKey(cur.Public(), id.Leaf().PublicKey) {
		if err := d.writeIdentity(id, false); err != nil {
			return err
		}
	} else if !d.keystoreHolds(id.Leaf()) {
		if err := d.writeIdentity(id, false); err != nil {
			return err
		}
	}
	if pk, err := d.pendingKey(false); err == nil && pk != nil && identity.SamePublicKey(pk.Public(), id.Leaf().PublicKey) {
		return d.removePendingKey()
	}
	return nil
}

func (d Dir) keystoreHolds(leaf *x509.Certificate) bool {
	pass, err := readSmall(d.PKCS12PasswordFile())
	if err != nil {
		return false
	}
	p12, err := readSmall(d.PKCS12File())
	if err != nil {
		return false
	}
	_, c, _, err := pkcs12.DecodeChain(p12, string(pass))
	return err == nil && c.Equal(leaf)
}

// writeIdentity writes the certificate files of id. withRoots also writes
// certs/ca.crt (a join); a renewal keeps the roots it pinned. The
// certificate is renamed into place before its key, so a crash between
// the two leaves a certificate whose key is still keys/pending.key, which
// LoadIdentity finds.
func (d Dir) writeIdentity(id *identity.Identity, withRoots bool) error {
	if err := d.ensure(); err != nil {
		return err
	}
	var chainPEM, rootsPEM []byte
	for _, c := range id.Chain {
		chainPEM = append(chainPEM, ca.EncodeCertPEM(c)...)
	}
	for _, c := range id.Roots {
		rootsPEM = append(rootsPEM, ca.EncodeCertPEM(c)...)
	}
	keyPEM, err := ca.EncodeKeyPEM(id.Key)
	if err != nil {
		return err
	}
	pass, err := d.keystorePassword(withRoots)
	if err != nil {
		return err
	}
	p12, err := pkcs12.Modern.Encode(id.Key, id.Leaf(), append(append([]*x509.Certificate{}, id.Chain[1:]...), id.Roots...), pass)
	if err != nil {
		return fmt.Errorf("agent: building the keystore: %w", err)
	}
	var files []file
	if withRoots {
		files = append(files, file{d.CAFile(), rootsPEM, 0o644})
	}
	files = append(files,
		file{d.CertFile(), chainPEM, 0o644},
		file{d.KeyFile(), keyPEM, 0o600},
		file{d.PKCS12PasswordFile(), []byte(pass), 0o600},
		file{d.PKCS12File(), p12, 0o600},
	)
	return writeFiles(files...)
}

// keystorePassword keeps the keystore's password across renewals, so a
// daemon configured with the password file keeps working; a join (fresh)
// makes a new one.
func (d Dir) keystorePassword(fresh bool) (string, error) {
	if !fresh {
		if p, err := readSmall(d.PKCS12PasswordFile()); err == nil && len(p) >= 16 {
			return string(p), nil
		}
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// removeCertFiles deletes what a failed join may have written.
func (d Dir) removeCertFiles() {
	for _, p := range d.certFiles() {
		os.Remove(p)
	}
	atomicfile.SyncDir(d.path("certs"))
}

// file is one file of a multi-file write.
type file struct {
	path string
	data []byte
	perm os.FileMode
}

// writeFiles writes every file to a temporary file beside it and syncs
// them all before renaming any, in order, then syncs the directories: a
// failure while writing changes nothing, and a crash leaves each file
// either old or new, never torn.
func writeFiles(files ...file) error {
	tmps := make([]string, 0, len(files))
	cleanup := func() {
		for _, t := range tmps {
			os.Remove(t)
		}
	}
	for _, f := range files {
		tmp, err := writeTemp(f)
		if err != nil {
			cleanup()
			return fmt.Errorf("agent: writing %s: %w", f.path, err)
		}
		tmps = append(tmps, tmp)
	}
	dirs := map[string]bool{}
	for i, f := range files {
		if err := os.Rename(tmps[i], f.path); err != nil {
			tmps = tmps[i:]
			cleanup()
			return fmt.Errorf("agent: %w", err)
		}
		dirs[filepath.Dir(f.path)] = true
	}
	for dir := range dirs {
		if err := atomicfile.SyncDir(dir); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	return nil
}

func writeTemp(f file) (string, error) {
	t, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".tmp-*")
	if err != nil {
		return "", err
	}
	name := t.Name()
	fail := func(err error) (string, error) {
		t.Close()
		os.Remove(name)
		return "", err
	}
	if err := t.Chmod(f.perm); err != nil {
		return fail(err)
	}
	if _, err := t.Write(f.data); err != nil {
		return fail(err)
	}
	if err := t.Sync(); err != nil {
		return fail(err)
	}
	if err := t.Close(); err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}
