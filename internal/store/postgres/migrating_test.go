package postgres

import (
	"errors"
	"slices"
	"testing"
)

// WithMigrating hears of the migrations Open is about to apply, once, and
// of none when the database is already at the newest schema: the
// authority says a migration is under way from it.
func TestOpenTellsOfMigrations(t *testing.T) {
	url := srv.NewDatabase(t)
	// A refusal stops Open with nothing applied: the next Open migrates
	// from version 0 still.
	stop := errors.New("not now")
	if s, err := Open(t.Context(), url, WithMigrating(func(from, to int) error { return stop })); !errors.Is(err, stop) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open with a refusing WithMigrating: %v, want its error", err)
	}
	for _, tc := range []struct {
		name string
		want [][2]int
	}{
		{"a new database", [][2]int{{0, latestVersion()}}},
		{"a database at the newest schema", nil},
	} {
		var got [][2]int
		s, err := Open(t.Context(), url, WithMigrating(func(from, to int) error { got = append(got, [2]int{from, to}); return nil }))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: migrating called with %v, want %v", tc.name, got, tc.want)
		}
	}
}
