package e2e

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/muster-dev/muster/internal/identity"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestStoreReapplyAfterSQLiteRestore: a store restored from a backup
// forgot a lock, a node deletion, a spent single-use token and a token
// deletion made since; once the audit files are moved aside as the
// refused start says, muster store reapply re-applies them from the store
// kept aside, each with its own record, and the authority started again
// refuses the locked node, the deleted node, the spent token and the
// deleted one. Before it, the restored store let all four back in
// silently. It carries the identities of an agent that renewed since the
// backup, of one that joined since and of one that joined under the ID
// of a node deleted since: they renew by themselves, where the restored
// store refused them certificate_unknown and they had to join again by
// hand. That of one locked since is carried too, saying it is locked: its
// agent stays refused, and the CRL relying parties fetch names the
// certificate it was issued since the backup, which the lock re-applied
// alone left off (the list is built from the certificates recorded).
func TestStoreReapplyAfterSQLiteRestore(t *testing.T) {
	t.Parallel()
	dir, _ := initDir(t)
	db := filepath.Join(dir, "muster.db")
	backup := filepath.Join(t.TempDir(), "muster.db")
	aside := filepath.Join(dir, "muster.db.before-restore")
	reapplyWalk(t, dir, func() { copyFile(t, db, backup) }, func() (string, string) {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Rename(db+suffix, aside+suffix); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		copyFile(t, backup, db)
		return "", "sqlite://" + aside
	})
}

// TestStoreReapplyAfterPostgresRestore: the same on PostgreSQL, the
// restored database a copy taken with the authority stopped (as a dump
// restored is) and the one kept aside the database in use until then (as
// the renamed one of high-availability.md is).
func TestStoreReapplyAfterPostgresRestore(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir := filepath.Join(t.TempDir(), "authority")
	mustRun(t, "init", "--data", dir, "--store", url)
	var backup string
	reapplyWalk(t, dir, func() { backup = pg.NewDatabaseFrom(t, url) }, func() (string, string) { return backup, url })
}

// reapplyWalk runs an authority on dir, calls backUp with it stopped,
// makes the changes a restore undoes, and calls restore, which puts the
// backup in place and returns the restored store's URL ("": the one
// authority.json records) and the one kept aside's.
func reapplyWalk(t *testing.T, dir string, backUp func(), restore func() (restored, from string)) {
	e := &joinEnv{dir: dir, auth: startAuthority(t, dir)}
	e.setup(t)
	stolen, _ := e.join(t, e.token(t), "stolen-01")
	gone, _ := e.join(t, e.token(t), "gone-01")
	renewer, _ := e.join(t, e.token(t), "renewer-01")
	retired, _ := e.join(t, e.token(t), "retired-01")
	spend := e.token(t, "--uses", "1")
	doomed := e.token(t, "--uses", "1")
	e.auth.stop(t)
	backUp()

	e.auth = startAuthority(t, dir)
	e.setup(t)
	// Renewed since and locked: its identity is carried, for the CRL.
	stolenSince := renewAs(t, e, stolen)
	var lock map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "create", "--node", "stolen-01", "--reason", "laptop stolen", "--data", dir, "-o", "json")), &lock); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "agents", "delete", "gone-01", "--data", dir)
	// Renewed since, then deleted: its certificate of since is on the
	// restored store's CRL.
	retiredSince := renewAs(t, e, retired)
	mustRun(t, "agents", "delete", "retired-01", "--data", dir)
	// Another machine joins under its ID, with a token made since: the
	// deletion re-applied frees the ID for it.
	regone, _ := e.join(t, e.token(t), "gone-01")
	since, _ := e.join(t, spend, "since-01")
	// An agent renews since the backup, with a new key: the restored
	// store knows neither its certificate nor its generation.
	renewer = renewAs(t, e, renewer)
	mustRun(t, "token", "delete", doomed[:6], "--data", dir)
	mustRun(t, "psk", "rotate", "--data", dir)
	e.auth.stop(t)

	restored, from := restore()
	var store []string
	if restored != "" {
		store = []string{"--store", restored}
	}
	reapply := func(extra ...string) []string {
		return append(append([]string{"store", "reapply", "--offline", "--data", dir, "--from", from}, store...), extra...)
	}

	// The refused start names the command, and the way out of it.
	r := muster(t, nil, append([]string{"authority", "--data", dir, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, store...)...)
	const lead = "kept as the evidence of what it removed: "
	_, mv, ok := strings.Cut(strings.TrimSpace(r.stderr), lead)
	if r.code == 0 || !ok || !strings.Contains(r.stderr, "muster store reapply --offline --data") {
		t.Fatalf("the authority on the restored store: exit %d, stderr %s; want a way out naming muster store reapply", r.code, r.stderr)
	}
	// The plan, before the files are moved aside: it changes nothing and
	// says what --apply needs first.
	plan := mustRun(t, reapply()...)
	for _, want := range []string{"To re-apply", "lock " + lock["id"].(string) + " on node stolen-01", "delete node gone-01",
		"carry node gone-01", "carry node stolen-01, instance ", "; locked in the store kept aside (lock " + lock["id"].(string) + " on node stolen-01): its agent stays out while the lock holds; the CRL names its certificate",
		"carry node renewer-01", "(the restored store holds generation 0)", "delete node retired-01",
		"retire deleted instance ", " of node retired-01 at generation 1 (the restored store holds it current at generation 0), with its 1 certificate(s) issued since (the CRL names those unexpired)", "carry node since-01", "(joined since the backup)",
		"token " + spend[:6] + ": 1 of its 1 uses spent", "delete token " + doomed[:6], "muster psk rotate --grace 0", "Before --apply: "} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan lacks %q:\n%s", want, plan)
		}
	}
	if out := mustFail(t, reapply("--apply")...); !strings.Contains(out, "the chain lost records") {
		t.Errorf("--apply before the audit files are moved aside: %s", out)
	}
	if out, err := exec.Command("sh", "-c", mv).CombinedOutput(); err != nil {
		t.Fatalf("the way out %q pasted: %v: %s", mv, err, out)
	}
	// The reapply the refusal names, pasted: the plan, from the file the
	// operator guide moves the store to.
	_, named, _ := strings.Cut(r.stderr, "once these files are moved aside, ")
	named, _, _ = strings.Cut(named, " prints what it re-applies")
	// On PostgreSQL only the operator knows the database kept aside.
	named = strings.Replace(named, "--from STORE", "--from '"+from+"'", 1)
	paste := exec.Command("sh", "-c", named)
	paste.Env = []string{"PATH=" + filepath.Dir(musterBin) + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if out, err := paste.CombinedOutput(); err != nil || !strings.Contains(string(out), "To re-apply") || strings.Contains(string(out), "Before --apply") {
		t.Fatalf("the reapply the refusal names, %q, pasted: %v\n%s", named, err, out)
	}
	// Another authority's store is refused, changing nothing.
	otherDir, _ := initDir(t)
	if out := mustFail(t, append([]string{"store", "reapply", "--offline", "--data", dir, "--from", "sqlite://" + filepath.Join(otherDir, "muster.db"), "--apply"}, store...)...); out == "" {
		t.Error("a store of another authority was not refused")
	}

	out := mustRun(t, reapply("--apply")...)
	if !strings.Contains(out, "Re-applied:") || strings.Count(out, ": done, record") != 10 {
		t.Fatalf("store reapply --apply: want 10 steps done:\n%s", out)
	}
	// Again: everything is in place, and the restored store's head is
	// still found past the records the first run appended.
	if again := mustRun(t, reapply("--apply")...); !strings.Contains(again, "Nothing to re-apply") {
		t.Errorf("store reapply run again:\n%s", again)
	}

	crlAddr := freePort(t)
	e.auth = startAuthority(t, dir, append([]string{"--crl-listen", crlAddr, "--crl-url", "http://" + crlAddr}, store...)...)
	e.setup(t)
	// Relying parties find the locked node's certificate of since the
	// backup on the list (its own list, and the one before the backup's
	// too), and the deleted node's. Before, only the backup's were, and
	// the current ones were accepted until they expired.
	for _, id := range []*identity.Identity{stolen, stolenSince, retired, retiredSince} {
		leaf, inter := id.Chain[0], id.Chain[1]
		url := "http://" + crlAddr + "/crl/agent-" + inter.SerialNumber.Text(16) + ".crl"
		// The authority signs its first lists as it starts: until then
		// it answers 503.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			resp, err := crlClient.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break
			}
		}
		rl, _ := fetchCRL(t, url, inter)
		if !slices.ContainsFunc(rl.RevokedCertificateEntries, func(r x509.RevocationListEntry) bool { return r.SerialNumber.Cmp(leaf.SerialNumber) == 0 }) {
			t.Errorf("the CRL lacks the locked or deleted node's certificate %s: %+v", leaf.SerialNumber.Text(16), rl.RevokedCertificateEntries)
		}
	}
	_, err := e.renew(t, stolen, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "locked")
	// The carried identity lets the locked agent no further in.
	_, err = e.renew(t, stolenSince, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "locked")
	_, err = e.renew(t, gone, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "deleted")
	_, err = e.renew(t, retiredSince, must2(newCSR(t)))
	wantCode(t, err, codes.PermissionDenied, "deleted")
	_, csr := newCSR(t)
	_, err = e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: spend, NodeId: "again-01", Csr: csr})
	wantCode(t, err, codes.FailedPrecondition, "")
	_, err = e.boot.ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{JoinToken: doomed, NodeId: "again-02", Csr: csr})
	wantCode(t, err, codes.NotFound, "")
	// The agents that renewed or joined since the backup renew by
	// themselves, without joining again, and on from there. Before, the
	// restored store refused both certificate_unknown.
	for _, id := range []*identity.Identity{renewer, since, regone} {
		renewAs(t, e, renewAs(t, e, id))
	}

	var recs []map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "audit", "list", "--data", dir, "--action", "store.reapply", "-o", "json")), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 10 {
		t.Fatalf("store.reapply records: %v, want 10", recs)
	}
	for _, rec := range recs {
		if reason, _ := rec["reason"].(string); !strings.Contains(reason, "re-applies record ") || rec["actor"] != "muster store reapply" {
			t.Errorf("store.reapply record names no record it re-applies: %v", rec)
		}
	}
	if out := mustRun(t, "audit", "verify", "--data", dir); !strings.Contains(out, "intact") {
		t.Errorf("audit verify after the reapply: %s", out)
	}
}

// renewAs renews id's certificate with a new key and returns the
// identity of the new one.
func renewAs(t *testing.T, e *joinEnv, id *identity.Identity) *identity.Identity {
	t.Helper()
	key, csr := newCSR(t)
	resp, err := e.renew(t, id, csr)
	if err != nil {
		t.Fatalf("renewal: %v", err)
	}
	return e.agentID(t, resp.GetCertificateChainPem(), key)
}

// TestStoreReapplyRefusesWhileAnAuthorityServes: store reapply refuses
// while an authority serves on the restored store, changing nothing and
// naming the way out, and runs once it is stopped: on SQLite by the
// locks the authority holds on its data directory and database file; on
// PostgreSQL, where replicas on other hosts share the database, by the
// serving lock every replica holds (the refusal names the replica's
// session). Before, on PostgreSQL nothing kept it out.
func TestStoreReapplyRefusesWhileAnAuthorityServes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		init func(t *testing.T) (dir string, store []string, copyAside func() string)
		// replica is the data directory store reapply runs from: on
		// PostgreSQL another replica's (a copy of dir, as high-
		// availability.md makes one), where no lock of dir's tells.
		replica bool
		want    []string
	}{
		{"sqlite", func(t *testing.T) (string, []string, func() string) {
			dir, _ := initDir(t)
			return dir, nil, func() string {
				aside := filepath.Join(t.TempDir(), "muster.db")
				copyFile(t, filepath.Join(dir, "muster.db"), aside)
				return "sqlite://" + aside
			}
		}, false, []string{"it works with the authority stopped", "in use by another authority", "systemctl stop muster-authority"}},
		{"postgres", func(t *testing.T) (string, []string, func() string) {
			url := postgres(t)
			dir := filepath.Join(t.TempDir(), "authority")
			mustRun(t, "init", "--data", dir, "--store", url)
			return dir, nil, func() string { return pg.NewDatabaseFrom(t, url) }
		}, true, []string{"it works with every authority on the store", "(muster authority (serving))", "stop every replica (systemctl stop muster-authority on each, and discovery where it serves on this database)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, store, copyAside := tc.init(t)
			// The store kept aside is named before the authority runs: a
			// PostgreSQL copy needs its template unused.
			aside := copyAside()
			a := startAuthority(t, dir, store...)
			from := dir
			if tc.replica {
				from = filepath.Join(t.TempDir(), "replica")
				if out, err := exec.Command("cp", "-a", dir, from).CombinedOutput(); err != nil {
					t.Fatalf("cp -a: %v: %s", err, out)
				}
			}
			args := append([]string{"store", "reapply", "--offline", "--data", from, "--from", aside}, store...)
			msg := mustFail(t, append(args, "--apply")...)
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("store reapply with the authority serving: %q, want %q", msg, want)
				}
			}
			a.stop(t)
			// Stopped: it runs (and refuses the store kept aside, taken
			// before the authority's start appended to the chain, for
			// that reason alone).
			if msg := mustFail(t, append(args, "--apply")...); !strings.Contains(msg, "does not hold record") {
				t.Errorf("store reapply with the authority stopped: %q, want it to reach the stores", msg)
			}
		})
	}
}

// TestStoreReapplyAfterRestoringABackupFromBeforeTheUpgrade: a backup
// taken before the upgrade (the schema a release before 0025 left) and
// restored under the new muster: store reapply, run before any start,
// migrates the restored store first, saying so, and re-applies the lock
// made since; the authority then starts on it with the lock in force.
// Before, it refused the older schema ("would migrate it"), and the way
// out it named (start the authority, which migrates it) appends to the
// restored chain, after which nothing can be re-applied.
func TestStoreReapplyAfterRestoringABackupFromBeforeTheUpgrade(t *testing.T) {
	t.Parallel()
	latest := knownSchema(t)
	dir, _ := initDir(t)
	db := filepath.Join(dir, "muster.db")
	backup := filepath.Join(t.TempDir(), "muster.db")
	startAuthority(t, dir).stop(t)
	copyFile(t, db, backup)
	takeBackSchema(t, backup)

	a := startAuthority(t, dir)
	var lock map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "lock", "create", "--node", "stolen-01", "--reason", "laptop stolen", "--data", dir, "-o", "json")), &lock); err != nil {
		t.Fatal(err)
	}
	a.stop(t)

	aside := db + ".before-restore"
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(db+suffix, aside+suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	copyFile(t, backup, db)
	kept := t.TempDir()
	for _, name := range []string{"audit-head", "audit-checkpoint.json"} {
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(kept, name)); err != nil {
			t.Fatal(err)
		}
	}
	reapply := []string{"store", "reapply", "--offline", "--data", dir, "--from", "sqlite://" + aside}
	r := muster(t, nil, reapply...)
	if r.code != 0 || !strings.Contains(r.stdout, "lock "+lock["id"].(string)+" on node stolen-01") {
		t.Fatalf("store reapply on a backup from before the upgrade: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, fmt.Sprintf("The restored store is at schema version 24, from before the upgrade to version %d", latest)) {
		t.Errorf("store reapply did not say it migrates the restored store: %s", r.stderr)
	}
	if v := schemaOf(t, dir); v != latest {
		t.Fatalf("the restored store at schema %d after reapply, want %d", v, latest)
	}
	if out := mustRun(t, append(reapply, "--apply")...); strings.Count(out, ": done, record") != 1 {
		t.Fatalf("store reapply --apply: want the lock re-applied:\n%s", out)
	}
	startAuthority(t, dir)
	if out := mustRun(t, "lock", "list", "--data", dir); !strings.Contains(out, lock["id"].(string)) {
		t.Errorf("the locks after the reapply lack %s:\n%s", lock["id"], out)
	}
}
