package postgres

import (
	"context"
	"errors"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Leadership of background jobs across replicas. A replica leads a job
// while it holds a session-level advisory lock on a connection of its own:
// the lock lives exactly as long as that connection, so a replica that dies
// (or loses the database) releases it without anyone's help, and another
// replica, polling, takes it within leaderPoll.

// leaderPoll is how often a follower tries the lock and a leader checks its
// connection.
var leaderPoll = 2 * time.Second

// leaderKey maps a job name to its advisory lock key, apart from the key
// that serializes the audit chain and the node claims.
func leaderKey(job string) int64 {
	h := fnv.New64a()
	h.Write([]byte("muster-leader:" + job))
	return int64(h.Sum64())
}

// RunAsLeader runs fn while this process leads job, and waits to lead again
// whenever it loses the lead, until ctx ends. fn gets a context cancelled
// when the lead is lost; it should return promptly then.
func (s *Store) RunAsLeader(ctx context.Context, job string, fn func(context.Context) error) error {
	key := leaderKey(job)
	for {
		if err := s.leadOnce(ctx, key, fn); err != nil && ctx.Err() == nil {
			// The job failed, or the connection did: wait and try again.
			select {
			case <-ctx.Done():
			case <-time.After(leaderPoll):
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (s *Store) leadOnce(ctx context.Context, key int64, fn func(context.Context) error) error {
	// A connection outside the pool: the pool may recycle its connections,
	// and the lock must not outlive this process's hold on it.
	var conn *pgx.Conn
	err := s.pool.bound(ctx, func(ctx context.Context) (err error) {
		conn, err = pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var got bool
		err := s.pool.bound(ctx, func(ctx context.Context) error {
			return conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got)
		})
		if err != nil {
			return err
		}
		if got {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(leaderPoll):
		}
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(lctx) }()
	t := time.NewTicker(leaderPoll)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, leaderPoll)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil && ctx.Err() == nil {
				// The lock went with the connection: stop leading.
				cancel()
				<-done
				return errors.Join(errors.New("postgres: lost the leader lock's connection"), err)
			}
		}
	}
}
