package datadir

import (
	"context"
	"sync"

	"github.com/muster-dev/muster/internal/signer"
)

// madeKeys are the keys a running init has made in key custody, each with
// how to destroy it: a failed init destroys them all, since a key made in
// a PKCS#11 token outlives the staging directory and the store that
// would have named it. Safe for concurrent use.
type madeKeys struct {
	mu      sync.Mutex
	destroy []func(context.Context) error
}

func (m *madeKeys) add(destroy func(context.Context) error) {
	m.mu.Lock()
	m.destroy = append(m.destroy, destroy)
	m.mu.Unlock()
}

// destroyAll destroys every key made, newest first, and returns the
// first failure (each is tried).
func (m *madeKeys) destroyAll(ctx context.Context) error {
	m.mu.Lock()
	fns := m.destroy
	m.destroy = nil
	m.mu.Unlock()
	var first error
	for i := len(fns) - 1; i >= 0; i-- {
		if err := fns[i](ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// signerDestroyer is the optional ability of a signer custody to destroy
// a key it generated (signer.InCustody has it).
type signerDestroyer interface {
	Destroy(ctx context.Context, versionID string, k signer.Key) error
}

// signers returns c recording, in m, every key it generates that it can
// destroy.
func (m *madeKeys) signers(c signer.Custody) signer.Custody {
	if _, ok := c.(signerDestroyer); !ok {
		return c
	}
	return recordingSigners{Custody: c, made: m}
}

type recordingSigners struct {
	signer.Custody
	made *madeKeys
}

func (r recordingSigners) Generate(ctx context.Context, versionID string) (signer.Key, error) {
	k, err := r.Custody.Generate(ctx, versionID)
	if err == nil {
		d := r.Custody.(signerDestroyer)
		r.made.add(func(ctx context.Context) error { return d.Destroy(ctx, versionID, k) })
	}
	return k, err
}
