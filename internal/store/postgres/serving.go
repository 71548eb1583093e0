package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replicas serving and offline commands that need none. On SQLite the
// authority's flock on the database file keeps such a command out; a
// shared database has no file, so every authority serving on it holds
// servingLockKey shared, on a connection of its own for as long as it
// runs, and the command takes it exclusively on its own connection for
// as long as it works: either waits for nothing and is refused at once.
// A session-level lock lives exactly as long as its connection, so a
// replica that dies (or loses the database) releases it with no one's
// help.

// ErrServing reports a database authorities serve on, to a command that
// needs them stopped.
var ErrServing = errors.New("postgres: authorities serve on this database")

// ErrExcluded reports a database an offline command holds, to an
// authority starting.
var ErrExcluded = errors.New("postgres: an offline command that needs every authority stopped works on this database")

// servingApp is the application_name of the connections that hold the
// lock, as pg_stat_activity shows them.
// Discovery replicas on the same database hold it too, under their own
// name.
const (
	servingApp          = "muster authority (serving)"
	discoveryServingApp = "muster discovery (serving)"
	excludingApp        = "muster (offline, authorities stopped)"
)

// servingAppOf is the application_name of who's (ServingAuthority or
// ServingDiscovery) connection holding the lock.
func servingAppOf(who Server) string {
	if who == ServingDiscovery {
		return discoveryServingApp
	}
	return servingApp
}

// Server is who holds the serving lock: an authority or a discovery
// replica, named so in the sessions a refused command lists.
type Server int

const (
	ServingAuthority Server = iota
	ServingDiscovery
)

// How soon the holder of the exclusive lock notices its connection is
// gone (the database restarted, the session ended, the network cut): its
// connection is checked every excludedCheck, each check within
// excludedCheckTimeout, so a loss is known within their sum (12 s by
// default; docs/high-availability.md, "Backup and restore"). Variables for tests.
var (
	excludedCheck        = leaderPoll
	excludedCheckTimeout = DefaultRequestTimeout
)

// serverKeepalives makes the database notice a lock holder's dead
// connection, and end its session (letting go of the lock), within some
// 25 s rather than the server host's TCP default of over two hours: a
// replica cut off would otherwise keep reapply out, and reapply cut off
// would keep every replica out. Ignored on a Unix socket. Set on the
// session, not as startup parameters: PgBouncer (session mode, which
// docs/high-availability.md allows) refuses a connection whose startup
// packet carries parameters it does not know, and a replica refused its
// lock would not start.
const serverKeepalives = `SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3`

// HoldServing takes the serving lock shared for this process until
// release, refusing with ErrExcluded while an offline command holds it.
// Should the connection fail, it is made again and the lock taken again,
// every leaderPoll; onLost, if not nil, hears of the loss once (not of
// every try through a database outage, which the store's own outage
// report already tells) and, with nil, of the lock held again.
func (s *Store) HoldServing(ctx context.Context, onLost func(error)) (release func(), err error) {
	return s.HoldServingAs(ctx, ServingAuthority, onLost)
}

// HoldServingAs is HoldServing for who.
func (s *Store) HoldServingAs(ctx context.Context, who Server, onLost func(error)) (release func(), err error) {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = servingAppOf(who)
	take := func(ctx context.Context) (*pgx.Conn, error) {
		var conn *pgx.Conn
		err := s.pool.bound(ctx, func(ctx context.Context) (err error) {
			conn, err = pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				return err
			}
			if _, err = conn.Exec(ctx, serverKeepalives); err != nil {
				conn.Close(context.WithoutCancel(ctx))
			}
			return err
		})
		if err != nil {
			return nil, unavailable(fmt.Errorf("postgres: the serving lock: %w", err))
		}
		var got bool
		if err := s.pool.bound(ctx, func(ctx context.Context) error {
			return conn.QueryRow(ctx, `SELECT pg_try_advisory_lock_shared($1)`, servingLockKey).Scan(&got)
		}); err != nil || !got {
			conn.Close(context.WithoutCancel(ctx))
			if err != nil {
				return nil, unavailable(fmt.Errorf("postgres: the serving lock: %w", err))
			}
			return nil, ErrExcluded
		}
		return conn, nil
	}
	conn, err := take(ctx)
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(leaderPoll)
		defer t.Stop()
		excludedSaid := false
		for {
			select {
			case <-kctx.Done():
				if conn != nil {
					letGo(conn, `SELECT pg_advisory_unlock_shared($1)`)
				}
				return
			case <-t.C:
			}
			if conn == nil {
				c, err := take(kctx)
				if err == nil {
					// A later exclusion is news again.
					excludedSaid = false
				}
				switch {
				case onLost == nil || kctx.Err() != nil:
				case err == nil:
					onLost(nil)
				case errors.Is(err, ErrExcluded) && !excludedSaid:
					// Not an outage: an offline command took the lock
					// while this replica had lost it, and works on the
					// store under it.
					excludedSaid = true
					onLost(err)
				}
				conn = c
				continue
			}
			pctx, pcancel := context.WithTimeout(kctx, leaderPoll)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil && kctx.Err() == nil {
				conn.Close(context.Background())
				conn = nil
				if onLost != nil {
					onLost(fmt.Errorf("postgres: the serving lock's connection failed, taking it again: %w", err))
				}
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

// HoldServingAt takes the serving lock of the database at url shared, on
// a connection of its own, until release, refusing with ErrExcluded while
// an offline command holds it: what a starting authority holds while it
// opens (and migrates) the store, until Store.HoldServing holds it too,
// so that it never migrates a store the command works on.
func HoldServingAt(ctx context.Context, url string) (release func(), err error) {
	return HoldServingAtAs(ctx, url, ServingAuthority)
}

// HoldServingAtAs is HoldServingAt for who.
func HoldServingAtAs(ctx context.Context, url string, who Server) (release func(), err error) {
	conn, got, err := trySessionLock(ctx, url, servingAppOf(who), `SELECT pg_try_advisory_lock_shared($1)`)
	if err != nil {
		return nil, err
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, ErrExcluded
	}
	return func() { letGo(conn, `SELECT pg_advisory_unlock_shared($1)`) }, nil
}

// ExcludeServing takes the serving lock of the database at url
// exclusively, on a connection of its own, until release: no authority
// starts serving on it meanwhile. It refuses with ErrServing, naming the
// sessions of the authorities that hold it, while any serves.
func ExcludeServing(ctx context.Context, url string) (release func(), err error) {
	_, release, err = ExcludeServingWatched(ctx, url)
	return release, err
}

// ExcludeServingWatched is ExcludeServing for a command that writes while
// it holds the lock: the context it returns, derived from ctx, is
// cancelled with an error saying so once the lock's connection fails a
// check (within excludedCheck and excludedCheckTimeout), since the
// database let go of the lock with the session and a replica may start
// serving meanwhile: the command's writes under it stop.
func ExcludeServingWatched(ctx context.Context, url string) (watched context.Context, release func(), err error) {
	watched, _, release, err = ExcludeServingChecked(ctx, url)
	return watched, release, err
}

// ExcludeServingChecked is ExcludeServingWatched with check, which pings
// the lock's connection now (cancelling watched on a failure) and
// returns context.Cause(watched) if it is done: a command calls it right
// before each write, so a lock lost between two periodic checks does not
// let the write through. What is left is the time between check and the
// write's commit.
func ExcludeServingChecked(ctx context.Context, url string) (watched context.Context, check func(context.Context) error, release func(), err error) {
	conn, got, err := trySessionLock(ctx, url, excludingApp, `SELECT pg_try_advisory_lock($1)`)
	if err != nil {
		return nil, nil, nil, err
	}
	if !got {
		cctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		held := servingHolders(cctx, conn)
		cancel()
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, nil, fmt.Errorf("%w: %s", ErrServing, held)
	}
	watched, lose := context.WithCancelCause(ctx)
	var mu sync.Mutex // a pgx.Conn is used by one goroutine at a time
	closed := false
	ping := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if err := context.Cause(watched); err != nil || closed {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, excludedCheckTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && watched.Err() == nil {
			lose(fmt.Errorf("%w: %w", ErrExclusionLost, err))
		}
		return context.Cause(watched)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			mu.Lock()
			closed = true
			letGo(conn, `SELECT pg_advisory_unlock($1)`)
			mu.Unlock()
		}()
		t := time.NewTicker(excludedCheck)
		defer t.Stop()
		for {
			select {
			case <-watched.Done():
				return
			case <-t.C:
			}
			if ping(watched) != nil {
				return
			}
		}
	}()
	return watched, func(ctx context.Context) error { return ping(ctx) }, func() { lose(nil); <-done }, nil
}

// ErrExclusionLost reports an exclusive serving lock whose connection
// failed: the database let go of it, and replicas may serve again.
var ErrExclusionLost = errors.New("postgres: the connection holding the serving lock failed, so the database let go of it and authorities may start serving on the store: this command stopped rather than write under them; run it again")

// trySessionLock connects to the database at url as app and tries the
// serving lock with try (shared or exclusive), within one request's
// deadline: the connection, which holds the lock while it lives, and
// whether it got it; on an error the connection is closed.
func trySessionLock(ctx context.Context, url, app, try string) (*pgx.Conn, bool, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, false, errors.New("postgres: invalid connection URL")
	}
	cfg.RuntimeParams["application_name"] = app
	dialHungPeers(&cfg.Config, DefaultRequestTimeout)
	cctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, false, unavailable(fmt.Errorf("postgres: the serving lock: %w", err))
	}
	if _, err := conn.Exec(cctx, serverKeepalives); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, unavailable(fmt.Errorf("postgres: the serving lock: %w", err))
	}
	var got bool
	if err := conn.QueryRow(cctx, try, servingLockKey).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, unavailable(fmt.Errorf("postgres: the serving lock: %w", err))
	}
	return conn, got, nil
}

// servingHolders names the sessions that hold the serving lock: the
// address each authority connects from, and since when.
func servingHolders(ctx context.Context, conn *pgx.Conn) string {
	const unlisted = "the sessions holding the serving lock could not be listed (%v): see pg_locks"
	rows, err := conn.Query(ctx, `SELECT a.pid, COALESCE(host(a.client_addr), 'local'), a.application_name, a.backend_start
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid AND l.objsubid = 1
		ORDER BY a.backend_start LIMIT 10`, servingLockKey)
	if err != nil {
		return fmt.Sprintf(unlisted, err)
	}
	var held []string
	for rows.Next() {
		var (
			pid       int32
			from, app string
			since     time.Time
		)
		if err := rows.Scan(&pid, &from, &app, &since); err != nil {
			rows.Close()
			return fmt.Sprintf(unlisted, err)
		}
		held = append(held, fmt.Sprintf("session %d from %s (%s) since %s", pid, from, app, since.UTC().Format(time.RFC3339)))
	}
	if err := rows.Err(); err != nil {
		return fmt.Sprintf(unlisted, err)
	}
	if len(held) == 0 {
		return "the authorities holding the serving lock stopped meanwhile"
	}
	return "the serving lock is held by " + strings.Join(held, "; ")
}

// letGo releases the serving lock conn holds with unlock, then closes
// it. Closing alone lets go only once the server's session has ended,
// some moments after the client's goodbye: a command run right after an
// authority stopped (or a test) would still find the lock held. The
// unlock is bounded, and the close follows whatever it answers.
func letGo(conn *pgx.Conn, unlock string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, unlock, servingLockKey)
	conn.Close(ctx)
}
