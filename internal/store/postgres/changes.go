package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/muster-dev/muster/internal/store"
)

// changeChannel is the LISTEN/NOTIFY channel of changes an open agent
// stream must learn of: a lock, a node's deletion or supersession, a task
// queued for it, a signer step. The writes queue their notification with
// pg_notify inside their own transaction, and PostgreSQL delivers it to
// every listening session when, and only if, that transaction commits: a
// notification never precedes its change.
const changeChannel = "muster_changes"

// maxPayload bounds a notification's payload below PostgreSQL's 8000 bytes;
// a task for more nodes than fit is announced to every node.
const maxPayload = 4000

// watchPing is how often a quiet listening connection is checked with one
// query: a connection lost without a word (a dead peer, a dropped NAT
// entry) is noticed within this period, and WatchChanges returns.
var watchPing = 10 * time.Second

// changePayload encodes a change: its kind as a decimal, then the node IDs
// it concerns, one a line; the kind alone means every node.
func changePayload(kind store.ChangeKind, nodes []string) string {
	p := strconv.Itoa(int(kind))
	if len(nodes) == 0 {
		return p
	}
	if all := p + "\n" + strings.Join(nodes, "\n"); len(all) <= maxPayload {
		return all
	}
	return p
}

// parseChange decodes a payload; an unreadable kind is taken as every
// kind, for every node.
func parseChange(payload string) store.Change {
	k, nodes, _ := strings.Cut(payload, "\n")
	kind, err := strconv.Atoi(k)
	if err != nil || kind <= 0 || store.ChangeKind(kind)&^store.ChangeAll != 0 {
		return store.Change{Kind: store.ChangeAll}
	}
	c := store.Change{Kind: store.ChangeKind(kind)}
	if nodes != "" {
		c.Nodes = strings.Split(nodes, "\n")
	}
	return c
}

// queueNotify queues the notification of a change in a pipe's batch.
func queueNotify(p *pipe, kind store.ChangeKind, nodes ...string) {
	p.exec(notifyQuery, []any{changeChannel, changePayload(kind, nodes)}, wrapped("notify change"))
}

const notifyQuery = `SELECT pg_notify($1, $2)`

// WatchChanges listens for changes committed through any handle on the
// database, by any replica, on a dedicated connection (not one of the
// pool's). Once listening it announces store.ChangeAll for every node,
// since a change committed before may have gone unseen, then each change.
// It returns nil when ctx ends, or an error when the connection is lost;
// the caller calls again, and the first announcement covers whatever was
// missed. notify must not block.
func (s *Store) WatchChanges(ctx context.Context, notify func(store.Change)) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	// Waiting for a notification ends at a deadline on the socket, not a
	// cancel request, which could arrive late and cancel the ping after it.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	var conn *pgx.Conn
	err := s.pool.bound(ctx, func(ctx context.Context) (err error) {
		conn, err = pgx.ConnectConfig(ctx, cfg)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: watch changes: connect: %w", unavailable(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The listen and the safety poll have the store's deadline: a
	// database that stopped answering ends the watch, and the caller's
	// next one learns whether it is back.
	exec := func(sql string) error {
		return s.pool.bound(ctx, func(ctx context.Context) error {
			_, err := conn.Exec(ctx, sql)
			return err
		})
	}
	if err := exec(`LISTEN ` + changeChannel); err != nil {
		return wrap("watch changes: listen", err)
	}
	notify(store.Change{Kind: store.ChangeAll})
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
			if err := exec(`SELECT 1`); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return wrap("watch changes: ping", err)
			}
		case err != nil:
			return wrap("watch changes", err)
		default:
			notify(parseChange(n.Payload))
		}
	}
}
