package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
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
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'muster authority (serving)'`); err != nil {
		t.Fatalf("pg_terminate_backend: %v", err)
	}
	var release func()
	for {
		// The session lets go of the lock once it has exited, which
		// pg_terminate_backend does not wait for.
		if release, err = pgstore.ExcludeServing(ctx, url); err == nil {
			break
		}
		if !errors.Is(err, pgstore.ErrServing) || ctx.Err() != nil {
			t.Fatalf("ExcludeServing once the authority's lock connection failed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer release()
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
