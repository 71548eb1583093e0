package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// TestBackupIntoWhileWriting takes a backup while another goroutine
// appends to the store: the backup opens with the schema of the store,
// passes its integrity check, keeps the 0600 file the caller made, and
// holds a whole prefix of the chain.
func TestBackupIntoWhileWriting(t *testing.T) {
	t.Parallel()
	s, path := openTemp(t)
	ctx := t.Context()
	appendOne := func() error {
		_, err := s.AppendAudit(ctx, func(head store.AuditHead) (store.AuditRecord, error) {
			return store.AuditRecord{Seq: head.Seq + 1, Time: time.Unix(head.Seq+1, 0), Action: "x", Result: "ok",
				PrevHash: head.Hash, Hash: fmt.Appendf(nil, "h%d", head.Seq+1)}, nil
		})
		return err
	}
	for range 20 {
		if err := appendOne(); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := appendOne(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	dst := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	err = BackupInto(ctx, path, dst)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("BackupInto: %v", err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	v, err := CheckBackup(ctx, dst)
	if err != nil {
		t.Fatalf("CheckBackup: %v", err)
	}
	want, err := s.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v != want {
		t.Errorf("backup schema version %d, want %d", v, want)
	}
	b, err := Open(ctx, dst)
	if err != nil {
		t.Fatalf("opening the backup as a store: %v", err)
	}
	defer b.Close()
	recs, err := b.ListAudit(ctx, store.AuditFilter{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) < 20 {
		t.Fatalf("backup holds %d records, want at least the 20 appended before it", len(recs))
	}
	for i, r := range recs {
		if r.Seq != int64(i+1) {
			t.Fatalf("backup record %d has seq %d: not a whole prefix of the chain", i, r.Seq)
		}
	}
}

// TestBackupIntoRefusesAFullFile: VACUUM INTO writes only into an empty
// file, so a backup never lands over another database.
func TestBackupIntoRefusesAFullFile(t *testing.T) {
	t.Parallel()
	_, path := openTemp(t)
	dst := filepath.Join(t.TempDir(), "other.db")
	if err := os.WriteFile(dst, []byte("not empty"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := BackupInto(context.Background(), path, dst); err == nil {
		t.Fatal("BackupInto wrote into a file that was not empty")
	}
	if got, _ := os.ReadFile(dst); string(got) != "not empty" {
		t.Errorf("the file was changed: %q", got)
	}
}

func TestCheckBackupFindsDamage(t *testing.T) {
	t.Parallel()
	_, path := openTemp(t)
	dst := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(dst, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := BackupInto(t.Context(), path, dst); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	// Overwrite every page after the first (the header and schema stay
	// readable) with garbage.
	for i := 4096; i < len(b); i++ {
		b[i] = 0x5a
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = CheckBackup(t.Context(), dst)
	if err == nil {
		t.Fatal("CheckBackup passed a damaged backup")
	}
	if !strings.Contains(err.Error(), dst) {
		t.Errorf("error %q does not name the file", err)
	}
}
