package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// changeChannel is the LISTEN/NOTIFY channel of changes an open agent
// stream must learn of: a lock, a node's deletion or supersession, a task
// queued for it, a signer step. The writes queue their notification with
// pg_notify inside their own transaction, and PostgreSQL delivers it to
// every listening session when, and only if, that transaction commits: a
// notification never precedes its change.
const changeChannel = "muster_changes"

// everyone is the payload of a change that concerns every node.
const everyone = "*"

// maxPayload bounds a notification's payload below PostgreSQL's 8000 bytes;
// a task for more nodes than fit is announced to everyone.
const maxPayload = 4000

// watchPing is how often a quiet listening connection is checked with one
// query: a connection lost without a word (a dead peer, a dropped NAT
// entry) is noticed within this period, and WatchChanges returns.
var watchPing = 10 * time.Second

// changePayload encodes the node IDs a change concerns, one a line; none
// means everyone.
func changePayload(nodes []string) string {
	p := strings.Join(nodes, "\n")
	if len(nodes) == 0 || len(p) > maxPayload {
		return everyone
	}
	return p
}

// changeNodes decodes a payload; nil means everyone.
func changeNodes(payload string) []string {
	if payload == everyone || payload == "" {
		return nil
	}
	return strings.Split(payload, "\n")
}

// notifyTx queues the notification of a change made in tx.
func notifyTx(ctx context.Context, tx pgx.Tx, nodes ...string) error {
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, changeChannel, changePayload(nodes)); err != nil {
		return wrap("notify change", err)
	}
	return nil
}

// WatchChanges listens for changes committed through any handle on the
// database, by any replica, on a dedicated connection (not one of the
// pool's). Once listening it calls notify(nil), since a change committed
// before may have gone unseen, then notify with the node IDs of each change
// (nil: every node). It returns nil when ctx ends, or an error when the
// connection is lost; the caller calls again, and the first notify(nil)
// covers whatever was missed. notify must not block.
func (s *Store) WatchChanges(ctx context.Context, notify func(nodes []string)) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	// Waiting for a notification ends at a deadline on the socket, not a
	// cancel request, which could arrive late and cancel the ping after it.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("postgres: watch changes: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `LISTEN `+changeChannel); err != nil {
		return wrap("watch changes: listen", err)
	}
	notify(nil)
	for {
		wctx, cancel := context.WithTimeout(ctx, watchPing)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			// Quiet for a while: the safety poll, one query on this
			// connection, proves it still listens.
			if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return wrap("watch changes: ping", err)
			}
		case err != nil:
			return wrap("watch changes", err)
		default:
			notify(changeNodes(n.Payload))
		}
	}
}
