package store

import (
	"context"
	"time"
)

// KeyCustody is the PKCS#11 token an authority moved its keys into
// (muster ca migrate-custody, docs/hsm.md): its RFC 7512 URI and the
// module that opened it, never the PIN. Every replica reads it at start
// and refuses to start without a token, whatever its authority.json
// says.
type KeyCustody struct {
	URI    string
	Module string
	// RecordedAt is the store clock when it was recorded.
	RecordedAt time.Time
}

// CustodyStore keeps the recorded key custody. Safe for concurrent use.
type CustodyStore interface {
	// GetKeyCustody returns the recorded custody; ErrNotFound when none
	// was recorded (the keys made from now on are sealed).
	GetKeyCustody(ctx context.Context) (KeyCustody, error)
	// RecordKeyCustody records c, RecordedAt the store clock, in one
	// conditional write: only when none is recorded, or the one recorded
	// has c's URI (then nothing changes and it is returned, so a second
	// migration is harmless). ErrConflict, and nothing written, when
	// another token's URI is recorded. It returns what is recorded. When
	// it writes, audit builds its record (ca.migrate_custody), appended
	// in the same transaction (see AppendAudit): an error building or
	// appending it is returned and nothing is written; a record already
	// there appends nothing and does not call audit. A nil audit is
	// refused.
	RecordKeyCustody(ctx context.Context, c KeyCustody, audit func(head AuditHead) (AuditRecord, error)) (KeyCustody, error)
	// ClearKeyCustody removes the record of the token uri (a migration
	// rolled back before any key in the token was put to use), one
	// conditional delete. ErrNotFound when uri is not what is recorded.
	// audit builds its record (ca.migrate_custody), appended in the same
	// transaction as RecordKeyCustody's.
	ClearKeyCustody(ctx context.Context, uri string, audit func(head AuditHead) (AuditRecord, error)) error
}
