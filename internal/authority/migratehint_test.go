package authority

import "testing"

// TestMigrationStepsNameTheDataDir: the online commands a migration step
// names carry the data directory the migration ran on, shell-quoted, so
// that pasted on that host they reach its authority with its operator
// identity (without it they would read ./muster-data).
func TestMigrationStepsNameTheDataDir(t *testing.T) {
	for _, c := range []struct{ dir, want string }{
		{"/var/lib/muster", "`muster signer activate --data /var/lib/muster`"},
		{"/srv/my muster", "`muster signer activate --data '/srv/my muster'`"},
		{"", "`muster signer activate`"},
	} {
		if got := (CustodyMigration{DataDir: c.dir}).online("muster signer activate"); got != c.want {
			t.Errorf("DataDir %q: %s, want %s", c.dir, got, c.want)
		}
	}
}
