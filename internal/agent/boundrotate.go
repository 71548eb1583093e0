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
	"path/filepath"

	"github.com/muster-dev/muster/internal/atomicfile"
	"github.com/muster-dev/muster/internal/boundkeypair"
)

// NextBoundKeyFile is the pending bound key of a rotation in flight
// (PKCS#8 PEM, 0600): written before the agent answers the authority's
// request for a new key, renamed over keys/bound.key once a result names
// it as the bound key. Until then keys/bound.key stays the proof.
func (d Dir) NextBoundKeyFile() string { return d.path("keys", "bound.next.key") }

// newPendingBoundKey makes the key a rotation asks for and stores it as
// pending before it is sent anywhere.
func (a *Agent) newPendingBoundKey() (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(a.dir.NextBoundKeyFile(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.log.Info("made a new bound key for the rotation the authority asked for", "path", a.dir.NextBoundKeyFile())
	return priv, nil
}

// pendingBoundKey reads the pending key of an interrupted rotation; nil
// if there is none.
func (a *Agent) pendingBoundKey() (ed25519.PrivateKey, error) {
	priv, err := loadEd25519(a.dir.NextBoundKeyFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return priv, err
}

// settleBoundKey ends a rotation by the fingerprint of the key the
// authority says is bound now: the pending key becomes keys/bound.key
// (one rename, so a crash leaves the old key or the new, never neither);
// a pending key the authority did not bind is discarded, and the next
// request for a rotation makes a fresh one.
func (a *Agent) settleBoundKey(pending ed25519.PrivateKey, bound string) error {
	if pending == nil {
		return nil
	}
	pub, err := boundkeypair.NewPublicKey(pending.Public().(ed25519.PublicKey))
	if err != nil {
		return err
	}
	if bound != pub.Fingerprint() {
		a.log.Warn("the authority did not bind the pending key; discarding it", "bound", bound)
		if err := os.Remove(a.dir.NextBoundKeyFile()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("agent: %w", err)
		}
		return nil
	}
	if err := os.Rename(a.dir.NextBoundKeyFile(), a.dir.BoundKeyFile()); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(a.dir.BoundKeyFile())); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.log.Info("bound key rotated", "fingerprint", bound)
	return nil
}
