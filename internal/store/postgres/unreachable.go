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
	if poolGaveUp(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	// A statement sent on a connection pgx already knew was gone.
	return pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
}

// poolGaveUp reports whether err is pgxpool's giving up an acquire after
// every connection it tried, each it held and then a new one, failed the
// ping it sends first (pingHeldConns): the database accepts connections
// but answers nothing on them (a pooler or proxy whose server is gone, a
// server that ends each session as it starts). pgxpool's error has no
// type or sentinel, and its text blames a hook; the text is all there is
// to know it by.
func poolGaveUp(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() error }:
		return poolGaveUp(e.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range e.Unwrap() {
			if poolGaveUp(e) {
				return true
			}
		}
		return false
	}
	// Only the error that wraps none is read: a wrapper's text may
	// quote anything.
	return strings.HasPrefix(err.Error(), "pgxpool: too many failed attempts acquiring connection")
}

// unavailable returns err marked store.ErrUnavailable when the database is
// unreachable (unreachable), and err unchanged otherwise.
func unavailable(err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) || !unreachable(err) {
		return err
	}
	if poolGaveUp(err) {
		// Said so, for pgxpool's text suspects a bug of muster's.
		return fmt.Errorf("%w: every connection the pool tried failed its ping: the database accepts connections but does not answer on them: %w", store.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
