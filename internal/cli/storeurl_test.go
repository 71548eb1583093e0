package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/muster-dev/muster/internal/discoveryd"
)

// init's --store with a relative SQLite path is recorded absolute, where
// init ran; anything else as given.
func TestStoreAbsolute(t *testing.T) {
	wd, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ in, want string }{
		{"sqlite://muster.db", "sqlite://" + filepath.Join(wd, "muster.db")},
		{"sqlite://../db/muster.db", "sqlite://" + filepath.Join(filepath.Dir(wd), "db", "muster.db")},
		{"sqlite:///srv/muster.db", "sqlite:///srv/muster.db"},
		{"sqlite://", "sqlite://"},
		{"postgres://muster@db/muster", "postgres://muster@db/muster"},
	} {
		if got, err := storeAbsolute(c.in); err != nil || got != c.want {
			t.Errorf("storeAbsolute(%q) = %q, %v, want %q", c.in, got, err, c.want)
		}
	}
}

// authority.json records the store URL with its user and without any
// password, so the commands reading the data directory can connect with
// it and PGPASSWORD or PGPASSFILE.
func TestStoreURLWithoutPassword(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://muster@db.internal:5432/muster", "postgres://muster@db.internal:5432/muster"},
		{"postgres://muster:s3cret@db.internal:5432/muster?sslmode=require", "postgres://muster@db.internal:5432/muster?sslmode=require"},
		{"postgresql://muster:s3cret@db/muster?password=s3cret&pool_max_conns=8", "postgresql://muster@db/muster?pool_max_conns=8"},
		{"postgres://db/muster?sslpassword=s3cret&sslmode=verify-full", "postgres://db/muster?sslmode=verify-full"},
		{"postgres://db/muster", "postgres://db/muster"},
		{"postgres://muster:s3cret@db:bad port/muster", "postgres://…@"},
		// A query url.Query cannot read (a ";", a bad escape) hides the
		// password parameter from it: the URL is not recorded.
		{"postgres://muster@db/muster?password=s3cret;sslmode=require", "postgres://…@"},
		{"postgres://muster@db/muster?password=%zz-s3cret", "postgres://…@"},
		// A SQLite URL is a path, read as written (openStore): a space
		// or a '%' in it is not escaped into another file's name.
		{"sqlite:///srv/muster data/100%.db", "sqlite:///srv/muster data/100%.db"},
	} {
		got := storeURLWithoutPassword(c.in)
		if got != c.want {
			t.Errorf("storeURLWithoutPassword(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("storeURLWithoutPassword(%q) = %q keeps the password", c.in, got)
		}
	}
}

// A store URL in a message, log line or check-config's table is the one
// a command it names takes: the user kept (the URL pastes as --store),
// never a password, in the user information or a parameter.
func TestStoreURLShownKeepsTheUser(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://muster:s3cret@db/muster", "postgres://muster@db/muster"},
		{"postgres://db/muster?password=s3cret&sslmode=require", "postgres://db/muster?sslmode=require"},
		{"postgres://muster@db/muster?sslpassword=s3cret", "postgres://muster@db/muster"},
		{"postgres://db/muster?password=%zz-s3cret", "postgres://…@"},
		{"sqlite:///var/lib/muster/muster.db", "sqlite:///var/lib/muster/muster.db"},
	} {
		if got := storeURLWithoutPassword(c.in); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("storeURLWithoutPassword(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// discovery.addr records the store discovery opened as authority.json
// records the authority's: without a password; a SQLite file by its
// absolute path, so the commands find it from any directory; nothing for
// the data directory's own discovery.db.
func TestDiscoveryStoreRecord(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	d := discoveryd.Dir(filepath.Join(dir, "disc"))
	for _, c := range []struct{ in, want string }{
		{"postgres://muster:s3cret@db/discovery?password=s3cret&sslmode=require", "postgres://muster@db/discovery?sslmode=require"},
		{d.DefaultStoreURL(), ""},
		{"sqlite://disc/discovery.db", ""},
		{"sqlite://other.db", "sqlite://" + filepath.Join(dir, "other.db")},
		{"sqlite:///srv/discovery.db", "sqlite:///srv/discovery.db"},
	} {
		got, err := discoveryStoreRecord(d, c.in)
		if err != nil || got != c.want {
			t.Errorf("discoveryStoreRecord(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}
