package datadir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// operatorRefused is a store whose operator write fails.
type operatorRefused struct{ store.Store }

func (operatorRefused) InsertOperator(context.Context, store.Operator, func(store.AuditHead) (store.AuditRecord, error)) error {
	return errInjected
}

// muster init writes operator.pem before the store records the operator
// (InsertOperator): a failed write must leave no operator.pem anywhere
// the operator could take for a working identity (one the store does not
// know is refused certificate_unknown). The whole directory is built in
// a staging directory removed on failure, so nothing is left, neither
// the data directory nor the staging one, and the next init succeeds.
func TestFailedOperatorWriteLeavesNoIdentity(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	target := filepath.Join(parent, "a")
	db := filepath.Join(t.TempDir(), "store.db")
	_, err := Init(ctx, InitOptions{Dir: Dir(target), Name: "test", Now: time.Now(),
		OpenStore: func(ctx context.Context) (store.Store, error) {
			st, err := sqlite.Open(ctx, db)
			if err != nil {
				return nil, err
			}
			return operatorRefused{st}, nil
		}})
	if !errors.Is(err, errInjected) {
		t.Fatalf("init with a failing operator write: %v, want the failure", err)
	}
	left, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("%s left after a failed init", filepath.Join(parent, e.Name()))
	}
	if _, err := Init(ctx, InitOptions{Dir: Dir(target), Name: "test", Now: time.Now()}); err != nil {
		t.Fatalf("init again: %v", err)
	}
}
