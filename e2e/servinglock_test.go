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
