package store

import (
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
