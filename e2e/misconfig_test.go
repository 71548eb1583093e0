package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentRefusesUnusablePSKs: a PSK the agent cannot use is named as
// such, before anything is sent: all zeros (a placeholder, never a
// generated PSK) is invalid, and bare hex without the muster-psk: prefix
// may be another secret pasted in the wrong place.
func TestAgentRefusesUnusablePSKs(t *testing.T) {
	t.Parallel()
	fp := "sha256:" + strings.Repeat("ab", 32)
	for _, tt := range []struct{ name, key, want string }{
		{"all zeros", "muster-psk:" + strings.Repeat("0", 64), "PSK is invalid"},
		{"no prefix", strings.Repeat("0a", 32), "PSK is malformed"},
		// An environment file's line given as the PSK: the refusal names
		// the command that prints the PSK as it must be given.
		{"KEY=VALUE", "MUSTER_BOOTSTRAP_PSK=muster-psk:" + strings.Repeat("0a", 32), "PSK is malformed: want muster-psk: followed by 64 lower-case hex digits; give it as muster psk show --raw prints it"},
	} {
		adir := filepath.Join(t.TempDir(), "agent")
		r := muster(t, []string{"MUSTER_BOOTSTRAP_PSK=" + tt.key, "MUSTER_CA_FINGERPRINT=" + fp},
			"agent", "join", "--data", adir, "--node", "n1", "--authority", "127.0.0.1:1")
		if r.code == 0 || !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, "no join token") {
			t.Errorf("%s: exit %d, stderr %q; want %q", tt.name, r.code, r.stderr, tt.want)
		}
		assertNoAgentCerts(t, adir)
	}
}

// startRefused runs the authority and expects it to exit at once with a
// message on stderr containing each of want. Both listeners are on ports
// the OS chooses: a refusal that came only after binding must not take
// the default metrics port 7444 from a test (or an authority) beside it.
func startRefused(t *testing.T, dir string, extra []string, want ...string) {
	t.Helper()
	r := muster(t, nil, append([]string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, extra...)...)
	if r.code == 0 {
		t.Fatalf("authority %v started, want a refusal", extra)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("authority %v: stderr %q, want it to say %q", extra, r.stderr, w)
		}
	}
}

// TestAuthorityRefusesAnotherStore: the store is the one muster init
// created for the data directory, or the authority does not start: an
// empty PostgreSQL given to an authority initialised on SQLite, another
// authority's PostgreSQL or SQLite store. (A PostgreSQL authority started
// without --store, which used to create an empty muster.db and serve from
// it, opens the store authority.json records:
// TestOfflineCommandsUseTheRecordedStore.)
func TestAuthorityRefusesAnotherStore(t *testing.T) {
	t.Parallel()
	lite, _ := initDir(t)
	startRefused(t, lite, []string{"--store", postgres(t)}, "holds no authority", "--store it was initialised with")

	pgURL := postgres(t)
	onPG := filepath.Join(t.TempDir(), "pg-authority")
	out := mustRun(t, "init", "--data", onPG, "--store", pgURL, "-o", "json")
	pgID := strings.Split(strings.Split(out, `"authority_id": "`)[1], `"`)[0]
	startRefused(t, lite, []string{"--store", pgURL}, "belongs to authority "+pgID, "never share a store")

	other, _ := initDir(t)
	startRefused(t, lite, []string{"--store", "sqlite://" + filepath.Join(other, "muster.db")}, "belongs to authority", "never share a store")

	// The right stores still start, and their chains are intact.
	startAuthority(t, onPG, "--store", pgURL).stop(t)
	for _, d := range []string{lite, other} {
		a := startAuthority(t, d)
		if !strings.Contains(mustRun(t, "audit", "verify", "--data", d), "intact") {
			t.Errorf("audit verify of %s after the refusals", d)
		}
		a.stop(t)
	}
}

// TestInitCreatesMissingParents: init --data a/b/c where a/b does not exist
// creates the parents 0700 (private, as the data directory itself) and
// the authority starts from it; a refused init leaves no parent behind.
func TestInitCreatesMissingParents(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	mustRun(t, "init", "--data", dir)
	for _, p := range []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, mode %v; want a 0700 directory", p, err, fi.Mode().Perm())
		}
	}
	startAuthority(t, dir).stop(t)

	refused := filepath.Join(base, "x", "y", "z")
	mustFail(t, "init", "--data", refused, "--store", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if _, err := os.Stat(filepath.Join(base, "x")); err == nil {
		t.Error("a refused init left the parents it created")
	}
}

// TestAuthorityRefusesASecondOnOneSQLiteStore: a copy of a running
// authority's data directory (the same authority, so the store's check
// passes it) given --store of the same SQLite file refuses to start, as
// a second on the same directory does: one authority at a time uses an
// SQLite store (it leads every background job, and its settings are the
// store's). Once the first stops, the copy starts.
func TestAuthorityRefusesASecondOnOneSQLiteStore(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	first := startAuthority(t, dir)
	copied := replicaDir(t, dir)
	db := "sqlite://" + filepath.Join(dir, "muster.db")
	line := mustFail(t, "authority", "--data", copied, "--store", db, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	for _, want := range []string{"the SQLite store is in use by another authority (pid ", filepath.Join(dir, "muster.db"), "one authority at a time uses an SQLite store"} {
		if !strings.Contains(line, want) {
			t.Errorf("a second authority on one SQLite store: %q, want it to say %q", line, want)
		}
	}
	first.stop(t)
	startAuthority(t, copied, "--store", db).stop(t)
}
