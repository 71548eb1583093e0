package discoveryd

import (
	"context"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/store"
)

// AuditLog returns the logger of discovery's own audit chain in st, keyed
// from the data directory dir, for reading and verifying it whether or not
// a discovery is running on it (muster discovery audit).
func AuditLog(ctx context.Context, dir string, st store.Store) (*audit.Logger, error) {
	id, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if err := checkOwnStore(ctx, st); err != nil {
		return nil, err
	}
	return datadir.NewAuditLogger(st, id.StorageKey, id.Dir.CheckpointFile(), nil)
}
