package discoveryd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/store"
)

// Forget drops an authority's registration through the store, whether or
// not a discovery is running on it (muster discovery forget), and records
// it in discovery's audit chain. Running servers read registrations from
// the store at every request, so they stop serving it at once; the ID is
// free again, and its next registration that the allow-list admits locks
// it to its root anew. The authority's join reports are kept (they expire
// with the others). It returns the registration dropped; an error wrapping
// store.ErrNotFound if there is none.
func Forget(ctx context.Context, dir string, st store.Store, authorityID string) (store.Registration, error) {
	if err := discovery.ValidAuthorityID(authorityID); err != nil {
		return store.Registration{}, err
	}
	id, err := Load(dir)
	if err != nil {
		return store.Registration{}, err
	}
	if err := checkOwnStore(ctx, st); err != nil {
		return store.Registration{}, err
	}
	reg, err := st.GetRegistration(ctx, authorityID)
	if err == nil {
		err = st.DeleteRegistration(ctx, authorityID)
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Registration{}, fmt.Errorf("discoveryd: authority %s is not registered with this discovery: %w", authorityID, store.ErrNotFound)
	}
	if err != nil {
		return store.Registration{}, fmt.Errorf("discoveryd: forgetting %s: %w", authorityID, err)
	}
	logger, err := datadir.NewAuditLogger(st, id.StorageKey, id.Dir.CheckpointFile(), nil)
	if err != nil {
		return reg, err
	}
	if _, err := logger.Record(context.WithoutCancel(ctx), audit.Event{Actor: "muster discovery forget", Action: "authority.forget",
		Target: authorityID, Result: audit.ResultOK, Reason: fmt.Sprintf("registration deleted: version %d, root %s, registered %s",
			reg.Version, reg.RootFingerprint, reg.RegisteredAt.UTC().Format(time.RFC3339))}); err != nil {
		return reg, err
	}
	return reg, nil
}
