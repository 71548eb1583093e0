package postgres

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	// The store's connection settings, not the database, are at fault:
	// waiting will not mend them (misconfigured).
	if misconfigured(err) != "" {
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

// storeURLIs names where the store URL is set, for the errors that ask
// for it to be fixed.
const storeURLIs = "the store URL (store: in authority.yaml, MUSTER_STORE or --store)"

// misconfigured says which of the store's connection settings err shows
// to be wrong, "" if none: a connection the database refused for its
// user, password or database name, or whose TLS failed the settings
// (sslmode, sslrootcert, the host name under sslmode=verify-full,
// sslcert and sslkey). A pgconn.ConnectError wraps these as it wraps a
// refused connection, but they are the operator's to fix, not an outage
// to wait out: reported as store.ErrUnavailable, they would be retried
// for ever as a database that is down.
func misconfigured(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "28P01":
			return "the database refused the password of " + storeURLIs + ": set the right one there (or in the password file it names)"
		case strings.HasPrefix(pe.Code, "28"):
			return "the database refused the user of " + storeURLIs + " (" + pe.Message + "): fix the user there, or the server's pg_hba.conf entry for this host, user and sslmode"
		case pe.Code == "3D000":
			return "the database named by " + storeURLIs + " does not exist (" + pe.Message + "): fix the database name there, or create it"
		}
		return ""
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return ""
	}
	var (
		host  x509.HostnameError
		auth  x509.UnknownAuthorityError
		inval x509.CertificateInvalidError
		alert tls.AlertError
	)
	switch {
	case errors.As(err, &host):
		return "the database's TLS certificate is not for the host " + storeURLIs + " names (" + host.Error() + "): connect by a name the certificate holds, or use sslmode=verify-ca, which checks the issuer only"
	case errors.As(err, &auth):
		return "the database's TLS certificate is not signed by the CA in sslrootcert of " + storeURLIs + " (" + auth.Error() + "): point sslrootcert at the CA that signed the server's certificate"
	case errors.As(err, &inval):
		return "the database's TLS certificate is not valid (" + inval.Error() + "): renew the server's certificate, or fix sslrootcert in " + storeURLIs
	case errors.As(err, &alert):
		return "the database ended the TLS handshake (" + alert.Error() + "): it refused this client's certificate; check sslcert and sslkey in " + storeURLIs
	case leafSays(err, "server refused TLS connection"):
		// pgconn's error has no type.
		return "the database does not accept TLS, which the sslmode of " + storeURLIs + " requires: turn TLS on in the server (ssl = on), or, on a network where clear text is acceptable, set sslmode=disable"
	}
	var te *tls.CertificateVerificationError
	if errors.As(err, &te) {
		return "the database's TLS certificate failed verification (" + te.Error() + "): fix sslrootcert in " + storeURLIs
	}
	return ""
}

// leafSays reports whether an error err wraps that wraps none says text:
// a wrapper's own text is not read (a ConnectError's quotes its
// configuration).
func leafSays(err error, text string) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() error }:
		return leafSays(e.Unwrap(), text)
	case interface{ Unwrap() []error }:
		for _, e := range e.Unwrap() {
			if leafSays(e, text) {
				return true
			}
		}
		return false
	}
	return strings.Contains(err.Error(), text)
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
	if err == nil || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	if why := misconfigured(err); why != "" {
		return fmt.Errorf("postgres: %s: %w", why, err)
	}
	if !unreachable(err) {
		return err
	}
	if poolGaveUp(err) {
		// Said so, for pgxpool's text suspects a bug of muster's.
		return fmt.Errorf("%w: every connection the pool tried failed its ping: the database accepts connections but does not answer on them: %w", store.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
