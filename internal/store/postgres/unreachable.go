package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/muster-dev/muster/internal/store"
)

// unreachable reports whether err says the database cannot be reached or
// dropped the connection: a refused or failed connection, a connection
// cut mid-way (a restart, a crash, a failover, a proxy), or the server
// shutting down or not yet accepting connections. Such a request did not
// commit (a COMMIT whose answer was lost excepted, which every write
// of muster's tolerates by its retry rules), and the same request may
// succeed once the database is back.
func unreachable(err error) bool {
	// A request its caller cancelled or let time out says nothing of the
	// database (context.DeadlineExceeded is a net.Error too).
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08, connection exception; 57P01 admin shutdown, 57P02
		// crash shutdown, 57P03 cannot connect now (starting, stopping,
		// in recovery).
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	// A statement sent on a connection pgx already knew was gone.
	return pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
}

// unavailable returns err marked store.ErrUnavailable when the database is
// unreachable (unreachable), and err unchanged otherwise.
func unavailable(err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) || !unreachable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
