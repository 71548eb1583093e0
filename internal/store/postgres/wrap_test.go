package postgres

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// TestWrapInsufficientResources: a full disk (SQLSTATE 53100) and the rest
// of class 53 are store.ErrUnavailable, retried by agents; other errors
// are not.
func TestWrapInsufficientResources(t *testing.T) {
	for code, want := range map[string]bool{"53100": true, "53200": true, "53300": true, "42P01": false, "23505": false} {
		err := wrap("insert", &pgconn.PgError{Code: code})
		if got := errors.Is(err, store.ErrUnavailable); got != want {
			t.Errorf("SQLSTATE %s: ErrUnavailable %v, want %v (%v)", code, got, want, err)
		}
	}
}
