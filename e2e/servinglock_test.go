package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	neturl "net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pgstore "github.com/muster-dev/muster/internal/store/postgres"
)

// An authority whose serving lock's connection fails, and which muster
// store reapply's lock takes in that gap, stops serving with an error
// that says to start it again once the command has finished: it must not
// write to a store the command rewrites.
func TestAuthorityStopsWhenReapplyTakesTheStore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	auth := startAuthority(t, dir, "--store", url)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	defer killSessionsAndExclude(ctx, t, url, "muster authority (serving)")()
	select {
	case <-auth.done:
	case <-ctx.Done():
		t.Fatalf("the authority still serves on a store an offline command holds\n%s", auth.Logs())
	}
	if logs := auth.Logs(); auth.exitErr == nil || !strings.Contains(logs, "stopped serving") ||
		!strings.Contains(logs, "start it again once the command has finished") {
		t.Fatalf("the authority exited with %v; want an error saying to start it again once the command has finished\n%s", auth.exitErr, logs)
	}
}

// An authority starting while muster store reapply holds the store is
// refused before it opens the store, whose opening migrates it: it once
// migrated first, under the command.
func TestAuthorityStartingDoesNotMigrateUnderReapply(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	// An empty database: what opening it does shows as tables.
	empty := postgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	release, err := pgstore.ExcludeServing(ctx, empty)
	if err != nil {
		t.Fatalf("ExcludeServing: %v", err)
	}
	defer release()
	if line := mustFail(t, "authority", "--data", dir, "--store", empty, "--listen", "127.0.0.1:0"); !strings.Contains(line, "start the authority again once it has finished") {
		t.Errorf("the authority starting under reapply: %q, want the way out", line)
	}
	admin, err := pgx.Connect(ctx, empty)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("the refused authority created %d tables in the store reapply holds (migrated it)", tables)
	}
}

// killSessionsAndExclude ends the sessions named app of url's database
// (not those of the tests running beside it on the server), as a database
// restart or a network cut would, and takes the serving lock exclusively
// once they have let go of it, as muster store reapply does: release
// gives it back.
func killSessionsAndExclude(ctx context.Context, t *testing.T, url, app string) (release func()) {
	t.Helper()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, app); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	for {
		// The session lets go of the lock once it has exited, which
		// pg_terminate_backend does not wait for.
		if release, err = pgstore.ExcludeServing(ctx, url); err == nil {
			return release
		}
		if !errors.Is(err, pgstore.ErrServing) || ctx.Err() != nil {
			t.Fatalf("ExcludeServing once %s's lock connection failed: %v", app, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A discovery replica holds the serving lock as an authority does: one
// whose lock muster store reapply takes in a gap of its connection stops
// serving, with the way out; it once took no lock, and wrote to the store
// the command rewrites.
func TestDiscoveryStopsWhenReapplyTakesTheStore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "discovery")
	d := startDiscovery(t, dir, "--store", url)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	defer killSessionsAndExclude(ctx, t, url, "muster discovery (serving)")()
	select {
	case <-d.done:
	case <-ctx.Done():
		t.Fatalf("discovery still serves on a store an offline command holds\n%s", d.Logs())
	}
	if logs := d.Logs(); d.exitErr == nil || !strings.Contains(logs, "stopped serving") ||
		!strings.Contains(logs, "start it again once the command has finished: muster discovery --data") {
		t.Fatalf("discovery exited with %v; want an error saying to start it again once the command has finished\n%s", d.exitErr, logs)
	}
}

// Discovery starting while muster store reapply holds the store is
// refused, with the way out, before it opens the store, whose opening
// migrates it.
func TestDiscoveryStartingDoesNotMigrateUnderReapply(t *testing.T) {
	t.Parallel()
	empty := postgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	release, err := pgstore.ExcludeServing(ctx, empty)
	if err != nil {
		t.Fatalf("ExcludeServing: %v", err)
	}
	defer release()
	dir := filepath.Join(t.TempDir(), "discovery")
	line := mustFail(t, "discovery", "--data", dir, "--store", empty, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if !strings.Contains(line, "start discovery again once it has finished: muster discovery --data") {
		t.Errorf("discovery starting under reapply: %q, want the way out", line)
	}
	if n := publicTables(ctx, t, empty); n != 0 {
		t.Errorf("the refused discovery created %d tables in the store reapply holds (migrated it)", n)
	}
}

// publicTables counts the tables of the database at url.
func publicTables(ctx context.Context, t *testing.T, url string) int {
	t.Helper()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	return tables
}

// refusingProxy forwards TCP connections to a PostgreSQL server, but
// closes the first whose startup message names app, as a database that
// does not answer yet would.
func refusingProxy(t *testing.T, backend, app string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var refused atomic.Bool
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// sslmode=disable: the startup message comes first, its
				// length in its first 4 bytes.
				var n [4]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				startup := make([]byte, int(binary.BigEndian.Uint32(n[:]))-4)
				if _, err := io.ReadFull(c, startup); err != nil {
					return
				}
				if bytes.Contains(startup, []byte(app)) && refused.CompareAndSwap(false, true) {
					return
				}
				s, err := net.DialTimeout("tcp", backend, 5*time.Second)
				if err != nil {
					return
				}
				defer s.Close()
				if _, err := s.Write(append(n[:], startup...)); err != nil {
					return
				}
				go io.Copy(s, c)
				io.Copy(c, s)
			}()
		}
	}()
	return l.Addr().String()
}

// An authority whose serving lock's database does not answer when it
// starts refuses, with the way out, rather than open the store without
// it: it once opened (and could migrate) the store when the database
// answered a moment later, and took the lock only then.
func TestAuthorityStartingWithoutTheServingLockDoesNotOpenTheStore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = refusingProxy(t, u.Host, "muster authority (serving)")
	line := mustFail(t, "authority", "--data", dir, "--store", u.String(), "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if !strings.Contains(line, "is unavailable") || !strings.Contains(line, "start the database or make it reachable from here, then run this again") {
		t.Errorf("the authority starting without its serving lock: %q, want the database unavailable, with the way out", line)
	}
}

// Discovery whose serving lock's database does not answer when it starts
// refuses as the authority does, with the way out, rather than open (and
// maybe migrate) the store without the lock.
func TestDiscoveryStartingWithoutTheServingLockDoesNotOpenTheStore(t *testing.T) {
	t.Parallel()
	u, err := neturl.Parse(postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = refusingProxy(t, u.Host, "muster discovery (serving)")
	dir := filepath.Join(t.TempDir(), "discovery")
	line := mustFail(t, "discovery", "--data", dir, "--store", u.String(), "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if !strings.Contains(line, "is unavailable") || !strings.Contains(line, "start the database or make it reachable from here, then run this again") {
		t.Errorf("discovery starting without its serving lock: %q, want the database unavailable, with the way out", line)
	}
}
