package store

import (
	"context"
	"time"
)

// Setting is one shared setting as the store keeps it: the value every
// authority replica on the store uses, rather than its own
// authority.yaml's (docs/high-availability.md, "Settings kept in the
// store").
type Setting struct {
	Key string
	// Value is the setting's canonical text (a duration as Go prints it).
	Value string
	// Version counts the writes of Key, from 1.
	Version int64
	// UpdatedAt is the store clock at the last write.
	UpdatedAt time.Time
	// UpdatedBy is who wrote it last: "authority" for a replica recording
	// its authority.yaml value at its first start, else an operator.
	UpdatedBy string
}

// SettingStore keeps the shared settings. Safe for concurrent use.
type SettingStore interface {
	// ListSettings returns every setting held, ordered by key.
	ListSettings(ctx context.Context) ([]Setting, error)
	// PutSetting writes s.Key's Value and UpdatedBy (its Version and
	// UpdatedAt are ignored) in one conditional write: when from.Version
	// is 0 only if the store holds no value for the key, else only while
	// the held row is from as the caller read it, its Version and
	// UpdatedAt. The version alone does not identify the value: a store
	// restored from a backup and written back up to the same version holds
	// another, which a write from the lost one would replace unseen (its
	// audit record naming a value it does not replace); UpdatedAt, the
	// store clock of the write, tells the two apart. It returns the row
	// written: version from.Version+1, UpdatedAt the store clock. ErrConflict, and nothing written,
	// otherwise: of several writes from one version exactly one wins,
	// across replicas. A write announces ChangeSettings.
	//
	// audit builds the change's record (setting.set), appended to the
	// chain in the same transaction (see AppendAudit): the value changes
	// with its record or not at all. An error building or appending it
	// is returned and nothing is written; a nil audit is refused, as a
	// setting is never changed unaudited.
	PutSetting(ctx context.Context, s Setting, from Setting, audit func(head AuditHead) (AuditRecord, error)) (Setting, error)
	// Replicated reports whether several authority replicas may run on
	// the store at once (PostgreSQL). On a store that is not (SQLite:
	// one authority at a time, held by its data directory's lock) the
	// authority's own settings may change a shared setting at start,
	// as no other replica uses the store's value.
	Replicated() bool
}
