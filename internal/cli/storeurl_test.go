package cli

import (
	"strings"
	"testing"
)

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
