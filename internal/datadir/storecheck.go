package datadir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/muster-dev/muster/internal/store"
)

// The store's identity is the first record of its audit chain: muster init
// writes authority.init, naming the authority ID and the root fingerprint,
// before anything else, and the chain's hashes bind every later record to
// it. Every store muster ever initialised carries it, so nothing needs to be
// added to an existing one. authority.json records where the store is
// (Info.Store) for a store outside the data directory.

// ErrWrongStore reports a store that is not the one muster init created for
// a data directory.
var ErrWrongStore = errors.New("datadir: wrong store")

// initAction is the action of the record that stamps a store.
const initAction = "authority.init"

// StoreURL returns the URL of the store to open: given, else the one
// authority.json records (Info.Store: no password, which the driver then
// reads from PGPASSWORD or PGPASSFILE), else the embedded SQLite file.
// fromInfo says the URL is authority.json's, so that an error connecting
// can say where the password comes from. It refuses a data directory whose
// store is elsewhere but not recorded in full (authority.json written
// before it kept the user name, or no muster.db at all) before opening
// anything, so an empty muster.db is never created in its place.
func (d Dir) StoreURL(info Info, given string) (url string, fromInfo bool, err error) {
	if given != "" {
		return given, false, nil
	}
	if info.Store != "" {
		if strings.Contains(info.Store, redacted) {
			return "", false, fmt.Errorf("%w: %s was initialised with the store %s, recorded without its user name; "+
				"give --store URL (or store: in authority.yaml, or MUSTER_STORE)", ErrWrongStore, d, info.Store)
		}
		return info.Store, true, nil
	}
	if _, err := os.Stat(d.DatabaseFile()); errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("%w: %s has no muster.db, so its store is elsewhere; start with the --store URL it was initialised with", ErrWrongStore, d)
	}
	return d.DefaultStoreURL(), false, nil
}

// redacted stands for the user and password of a store URL in the
// authority.json of an init that recorded neither.
const redacted = "…@"

// auditLister is the part of the store CheckStore reads.
type auditLister interface {
	ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, error)
}

// CheckStore refuses a store that muster init did not create for info's
// authority: an empty one (initialised elsewhere, or never), or one that
// belongs to another authority, whose audit chain this one would break.
// where names the store in the message (without a password).
func CheckStore(ctx context.Context, st auditLister, d Dir, info Info, where string) error {
	recs, err := st.ListAudit(ctx, store.AuditFilter{Limit: 1})
	if err != nil {
		return fmt.Errorf("datadir: reading the store's first audit record: %w", err)
	}
	if len(recs) == 0 {
		return fmt.Errorf("%w: the store %s holds no authority; start %s with the --store it was initialised with, "+
			"or create a new authority on this store with muster init --data NEWDIR --store URL", ErrWrongStore, where, d)
	}
	first := recs[0]
	if first.Seq != 1 || first.Action != initAction {
		return fmt.Errorf("%w: the store %s does not begin with an authority.init record; it was not created by muster init", ErrWrongStore, where)
	}
	if first.Target != info.AuthorityID || first.Reason != "ca "+info.CAFingerprint {
		other := strings.TrimPrefix(first.Reason, "ca ")
		return fmt.Errorf("%w: the store %s belongs to authority %s (root %s), not to %s's authority %s (root %s); "+
			"two authorities never share a store: start with the --store %s was initialised with",
			ErrWrongStore, where, first.Target, other, d, info.AuthorityID, info.CAFingerprint, d)
	}
	return nil
}
