package audit

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/muster-dev/muster/internal/store"
)

// memStore is an in-memory Store for the tests that need many records or a
// failing store; the attacker tests use the real SQLite store.
type memStore struct {
	mu      sync.Mutex
	recs    []store.AuditRecord
	cps     []store.AuditCheckpoint
	failErr error // returned by every method when set
}

var _ Store = (*memStore)(nil)

func (m *memStore) AppendAudit(_ context.Context, build func(store.AuditHead) (store.AuditRecord, error)) (store.AuditRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failErr != nil {
		return store.AuditRecord{}, m.failErr
	}
	var head store.AuditHead
	if n := len(m.recs); n > 0 {
		head = store.AuditHead{Seq: m.recs[n-1].Seq, Hash: bytes.Clone(m.recs[n-1].Hash)}
	}
	r, err := build(head)
	if err != nil {
		return store.AuditRecord{}, fmt.Errorf("build: %w", err)
	}
	if r.Seq != head.Seq+1 || !bytes.Equal(r.PrevHash, head.Hash) {
		return store.AuditRecord{}, store.ErrConflict
	}
	m.recs = append(m.recs, r)
	return r, nil
}

func (m *memStore) AuditHead(context.Context) (store.AuditHead, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failErr != nil {
		return store.AuditHead{}, m.failErr
	}
	if n := len(m.recs); n > 0 {
		return store.AuditHead{Seq: m.recs[n-1].Seq, Hash: m.recs[n-1].Hash}, nil
	}
	return store.AuditHead{}, nil
}

// ListAudit honours only AfterSeq and Limit, which is all the package uses.
func (m *memStore) ListAudit(_ context.Context, f store.AuditFilter) ([]store.AuditRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failErr != nil {
		return nil, m.failErr
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	var out []store.AuditRecord
	for _, r := range m.recs {
		if r.Seq > f.AfterSeq && len(out) < limit {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *memStore) InsertAuditCheckpoint(_ context.Context, c store.AuditCheckpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failErr != nil {
		return m.failErr
	}
	for _, o := range m.cps {
		if o.Seq == c.Seq {
			return store.ErrConflict
		}
	}
	m.cps = append(m.cps, c)
	return nil
}

func (m *memStore) ListAuditCheckpoints(context.Context) ([]store.AuditCheckpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failErr != nil {
		return nil, m.failErr
	}
	return append([]store.AuditCheckpoint(nil), m.cps...), nil
}

func (m *memStore) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failErr = err
}
