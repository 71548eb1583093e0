package postgres

import (
	"context"
	"errors"
	"fmt"
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

// TestWrapCallerGone: a request its caller cancelled or let time out is
// not taken for the database's unavailability.
func TestWrapCallerGone(t *testing.T) {
	for _, err := range []error{context.Canceled, context.DeadlineExceeded, fmt.Errorf("timeout: %w", context.DeadlineExceeded)} {
		if got := wrap("select", err); errors.Is(got, store.ErrUnavailable) {
			t.Errorf("wrap(%v) = %v, want no ErrUnavailable", err, got)
		}
	}
	if got := wrap("select", &pgconn.ConnectError{}); !errors.Is(got, store.ErrUnavailable) {
		t.Errorf("a failed connection: %v, want ErrUnavailable", got)
	}
}
