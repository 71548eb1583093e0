package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/muster-dev/muster/internal/store"
)

// TestRecordKeyCustodyReadsWhatItWrote: a replica's RecordKeyCustody that
// commits its record reports that record, even when, right after its
// commit, another replica clears it and records another token (muster ca
// migrate-custody --rollback, then a migration to another token). Here
// the other replica waits for the commit on a lock of the whole table,
// which it takes before RecordKeyCustody can read anything after its
// commit, and swaps the record under it. Before, RecordKeyCustody read the
// record back after its commit and reported ErrConflict ("… is recorded
// already") for the record it had just made.
func TestRecordKeyCustodyReadsWhatItWrote(t *testing.T) {
	t.Parallel()
	s, url := openFresh(t)
	ctx := t.Context()
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(context.Background()) })

	swapped := make(chan error, 1)
	audit := func(h store.AuditHead) (store.AuditRecord, error) {
		// Inside the recording transaction, its INSERT made: the other
		// replica queues for the table behind it.
		go func() {
			swapped <- func() error {
				if _, err := other.Exec(ctx, `BEGIN`); err != nil {
					return err
				}
				if _, err := other.Exec(ctx, `LOCK TABLE key_custody IN ACCESS EXCLUSIVE MODE`); err != nil {
					return err
				}
				if _, err := other.Exec(ctx, `DELETE FROM key_custody WHERE id = 1`); err != nil {
					return err
				}
				if _, err := other.Exec(ctx, `INSERT INTO key_custody (id, uri, module, recorded_at) VALUES (1, 'pkcs11:token=other', '/opt/hsm/lib.so', 0)`); err != nil {
					return err
				}
				_, err := other.Exec(ctx, `COMMIT`)
				return err
			}()
		}()
		deadline := time.Now().Add(60 * time.Second)
		for {
			var waiting bool
			if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`,
				other.PgConn().PID()).Scan(&waiting); err != nil {
				return store.AuditRecord{}, err
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				return store.AuditRecord{}, errors.New("the other replica never queued for key_custody")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return store.AuditRecord{Seq: h.Seq + 1, Time: time.Now().UTC().Truncate(time.Microsecond), Actor: "test",
			Action: "ca.migrate_custody", Result: "ok", PrevHash: h.Hash, Hash: make([]byte, 32)}, nil
	}
	want := store.KeyCustody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}
	got, err := s.RecordKeyCustody(ctx, want, audit)
	if err != nil {
		t.Fatalf("RecordKeyCustody whose record committed: %v", err)
	}
	if got.URI != want.URI || got.Module != want.Module || got.RecordedAt.IsZero() {
		t.Errorf("RecordKeyCustody = %+v, want %+v recorded", got, want)
	}
	if err := <-swapped; err != nil {
		t.Fatal(err)
	}
	// The other replica's record is the one there now.
	if now, err := s.GetKeyCustody(ctx); err != nil || now.URI != "pkcs11:token=other" {
		t.Errorf("GetKeyCustody = %+v, %v: want the other replica's record", now, err)
	}
}
