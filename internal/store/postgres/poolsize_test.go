package postgres

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPoolMaxConnsDefault: without pool_max_conns in the URL the pool opens
// up to DefaultPoolMaxConns connections to the database at once (pgx's own
// default was the larger of 4 and the cores), and not one more.
func TestPoolMaxConnsDefault(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, srv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, fromURL := s.PoolMaxConns(); n != DefaultPoolMaxConns || fromURL {
		t.Fatalf("PoolMaxConns() = %d, %v; want %d, false", n, fromURL, DefaultPoolMaxConns)
	}
	held := acquireAll(t, s, DefaultPoolMaxConns)
	defer releaseAll(held)
	var open int
	if err := held[0].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open < DefaultPoolMaxConns {
		t.Errorf("%d connections to the database with the pool's %d held", open, DefaultPoolMaxConns)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if c, err := s.pool.p.Acquire(short); err == nil {
		c.Release()
		t.Errorf("a connection beyond the pool's %d was given", DefaultPoolMaxConns)
	}
}

// TestPoolMaxConnsFromURL: the URL's pool_max_conns wins over the default,
// smaller or larger.
func TestPoolMaxConnsFromURL(t *testing.T) {
	ctx := t.Context()
	url := srv.NewDatabase(t)
	for _, want := range []int32{2, DefaultPoolMaxConns + 4} {
		s, err := Open(ctx, url+"&pool_max_conns="+itoa(want))
		if err != nil {
			t.Fatal(err)
		}
		if n, fromURL := s.PoolMaxConns(); n != want || !fromURL {
			t.Errorf("pool_max_conns=%d: PoolMaxConns() = %d, %v", want, n, fromURL)
		}
		releaseAll(acquireAll(t, s, int(want)))
		s.Close()
	}
}

func TestSetsPoolMaxConns(t *testing.T) {
	for conn, want := range map[string]bool{
		"postgres://u@h:5432/db?sslmode=disable":                   false,
		"postgres://u@h:5432/db?sslmode=disable&pool_max_conns=32": true,
		"postgresql://u@h/db?pool_max_conns=8":                     true,
		"postgres://u:pool_max_conns=1@h/db":                       false, // a password
		"host=h dbname=db":                                         false,
		"host=h dbname=db pool_max_conns=8":                        true,
		"host=h pool_max_conns = 8":                                true,
		"host=h password='a pool_max_conns=8'":                     false, // a quoted password
	} {
		if got := setsPoolMaxConns(conn); got != want {
			t.Errorf("setsPoolMaxConns(%q) = %v, want %v", conn, got, want)
		}
	}
}

// acquireAll takes n connections from the pool at once, each checked to
// answer.
func acquireAll(t *testing.T, s *Store, n int) []*pgxpool.Conn {
	t.Helper()
	held := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := s.pool.p.Acquire(t.Context())
		if err != nil {
			releaseAll(held)
			t.Fatal(err)
		}
		held = append(held, c)
		if err := c.Ping(t.Context()); err != nil {
			releaseAll(held)
			t.Fatal(err)
		}
	}
	return held
}

func releaseAll(cs []*pgxpool.Conn) {
	for _, c := range cs {
		c.Release()
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
