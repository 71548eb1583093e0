package store

import (
	"os"
	"slices"
	"testing"
	"testing/fstest"
)

func TestLoadMigrations(t *testing.T) {
	ok := fstest.MapFS{
		"migrations/0001_a.sql": {Data: []byte("CREATE TABLE a (x);")},
		"migrations/0002_b.sql": {Data: []byte("CREATE TABLE b (x);")},
	}
	ms, err := LoadMigrations(ok)
	if err != nil || len(ms) != 2 || ms[1].Version != 2 {
		t.Errorf("LoadMigrations = %v, %v; want versions 1, 2", ms, err)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"gap":      {"migrations/0001_a.sql": {}, "migrations/0003_c.sql": {}},
		"no one":   {"migrations/0002_b.sql": {}},
		"bad name": {"migrations/init.sql": {}},
		"empty":    {},
	} {
		if _, err := LoadMigrations(fsys); err == nil {
			t.Errorf("LoadMigrations(%s) succeeded, want an error", name)
		}
	}
}

// TestBackendsMirrorMigrations: each backend's migration N is the same
// schema change, so a database's version means the same in both.
func TestBackendsMirrorMigrations(t *testing.T) {
	names := func(dir string) []string {
		ms, err := LoadMigrations(os.DirFS(dir))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	sqlite, postgres := names("sqlite"), names("postgres")
	if !slices.Equal(sqlite, postgres) {
		t.Fatalf("migrations differ: sqlite %v, postgres %v", sqlite, postgres)
	}
}
