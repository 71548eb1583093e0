package store

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// Migration is one numbered schema change of a backend. Every backend
// embeds its own migrations/NNNN_description.sql files, numbered from 1
// without gaps and mirroring each other number for number; a migration is
// never edited once released: changes go in a new file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads migrations/*.sql from fsys in version order.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	// Glob returns names sorted, and the zero-padded prefix sorts by number.
	var ms []Migration
	for i, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v != i+1 {
			return nil, fmt.Errorf("store: migration %s: want a name starting %04d_", base, i+1)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(b)})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("store: no migrations embedded")
	}
	return ms, nil
}

// MustLoadMigrations is LoadMigrations for a backend's embedded files, which
// the tests check: a bad set is a build mistake.
func MustLoadMigrations(fsys fs.FS) []Migration {
	ms, err := LoadMigrations(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

// SchemaTooNewError is a backend's refusal to open a database that a newer
// muster migrated. There are no down migrations, so the way out is a
// binary that knows the schema, or the backup taken before the upgrade:
// the message names both, since the operator meets it mid-rollback (an old
// replica restarted, a downgraded package) with the docs not at hand.
type SchemaTooNewError struct {
	Backend string // sqlite or postgres, the message's prefix
	At      int    // the database's schema version
	Knows   int    // the last migration this binary carries
}

func (e *SchemaTooNewError) Error() string {
	return fmt.Sprintf("%s: database is at schema version %d, this binary knows up to %d: "+
		"a newer muster migrated it, and no muster migrates a database back; "+
		"run a muster that knows schema version %d or later (`muster version` shows the version a binary knows), "+
		"or restore the database from the backup taken before the upgrade (docs/install.md, \"Upgrades\")",
		e.Backend, e.At, e.Knows, e.At)
}

// Unwrap makes the refusal errors.Is ErrSchemaTooNew.
func (e *SchemaTooNewError) Unwrap() error { return ErrSchemaTooNew }
