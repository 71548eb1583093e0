package datadir

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
)

// pgsrv is this package's PostgreSQL cluster.
var pgsrv *pgtest.Server

func TestMain(m *testing.M) { pgtest.Main(m, &pgsrv) }

var errInjected = errors.New("injected: the operator record could not be written")

// failingOperator is a PostgreSQL store whose operator write fails: muster
// init has written the PSK (and the token's intermediates) by then.
type failingOperator struct{ *postgres.Store }

func (failingOperator) InsertOperator(context.Context, store.Operator, func(store.AuditHead) (store.AuditRecord, error)) error {
	return errInjected
}

// TestFailedInitLeavesAnEmptyPostgres: muster init --store postgres://…
// that fails after its first writes drops the schema it made, so the next
// init into the same database succeeds; into a database whose schema was
// there before, nothing is dropped and the error names the way out.
func TestFailedInitLeavesAnEmptyPostgres(t *testing.T) {
	ctx := context.Background()
	url := pgsrv.NewDatabase(t)
	initWith := func(fail bool) error {
		o := InitOptions{Dir: Dir(filepath.Join(t.TempDir(), "a")), Name: "test", Now: time.Now(),
			OpenStore: func(ctx context.Context) (store.Store, error) {
				st, err := postgres.Open(ctx, url)
				if err != nil || !fail {
					return st, err
				}
				return failingOperator{st}, nil
			}}
		_, err := Init(ctx, o)
		return err
	}
	err := initWith(true)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "run muster init again") {
		t.Fatalf("init with a failing write: %v; want the failure, and the store as it was", err)
	}
	if err := initWith(false); err != nil {
		t.Fatalf("init after a failed one: %v; want the database found empty", err)
	}

	// A database migrated before init: its schema is not init's to drop.
	url = pgsrv.NewDatabase(t)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	err = initWith(true)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "DROP DATABASE") {
		t.Fatalf("init with a failing write into a migrated database: %v; want the way out named", err)
	}
	if err := initWith(false); !errors.Is(err, ErrAlreadyInitialised) || !strings.Contains(err.Error(), "DROP DATABASE") {
		t.Fatalf("init after that: %v; want refused, naming the way out", err)
	}
}
