package authority

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/jwtsvid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
)

// TestJWTKeysAfterARestore: a store restored from an older backup and
// rotated back up reaches versions it had before. The backup's own keys
// come back (the current one and the next, which it published), but a
// version past them gets a key, and a key ID, never published before the
// restore: a key rotated away since the backup (after a leak) never signs
// or verifies again. A replica that signs with the version as it was
// before the restore takes the restored store's key of it at its next
// read. With keys derived from the version alone, versions 4 and 5 were
// their keys of before the restore again.
func TestJWTKeysAfterARestore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "muster.db")
	b := startReplicas(t, func(ctx context.Context) (store.Store, error) { return sqlite.Open(ctx, path) }, 1)
	r, ctx := b.srvs[0], t.Context()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// kids rotates the store up to version to, as the leader does, and
	// returns the key IDs each version published, by version.
	kids := func(what string, to int64) map[int64]string {
		t.Helper()
		out := map[int64]string{}
		for {
			k, err := b.store.GetJWTKey(ctx)
			if err != nil {
				t.Fatal(err)
			}
			iss, err := jwtsvid.NewVersioned(b.sk.Derive, k.Version, jwtSalts(k))
			if err != nil {
				t.Fatal(err)
			}
			for kid, v := range iss.KeyVersions() {
				if was, ok := out[v]; ok && was != kid {
					t.Fatalf("%s: version %d published as %s and %s", what, v, was, kid)
				}
				out[v] = kid
			}
			if k.Version >= to {
				return out
			}
			if _, err := r.rotateJWTKey(ctx, k, audit.Event{Actor: "authority", Reason: "the test rotates"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	kids("before the backup", 2)
	var backup [5]any // version, rotated_at and the three salts
	if err := db.QueryRowContext(ctx, `SELECT version, rotated_at, prev_salt, salt, next_salt FROM jwt_svid_key`).
		Scan(&backup[0], &backup[1], &backup[2], &backup[3], &backup[4]); err != nil {
		t.Fatal(err)
	}
	before := kids("before the restore", 5)
	signedBefore := r.jwt.Load().KeyID()
	if _, err := db.ExecContext(ctx, `UPDATE jwt_svid_key SET version = ?, rotated_at = ?, prev_salt = ?, salt = ?, next_salt = ?`, backup[:]...); err != nil {
		t.Fatal(err)
	}
	after := kids("after the restore", 5)
	for v := int64(1); v <= 6; v++ {
		backupPublished := v <= 3 // the backup's version 2, the previous and the next
		if got, was := after[v], before[v]; backupPublished != (got == was) {
			t.Errorf("version %d: key %s after the restore, %s before; want the same key only for the backup's own (1 to 3)", v, got, was)
		}
	}
	if err := r.jwtKeyStepWith(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := r.jwt.Load().KeyID(); got != after[5] || got == signedBefore {
		t.Fatalf("the replica signs with %s after reading the restored store's version 5; want its key %s, not %s of before the restore", got, after[5], signedBefore)
	}
}

// TestJWTKeyOfAReplicaRunningAcrossARestore: a replica that keeps running
// while the store is restored under it from a backup of an earlier
// version follows the store back at its next read, signing with the
// backup's version and key, as every replica started on the restored
// store does. Before, it went on signing with the later version it had
// (a key the operator may have rotated away since the backup, after a
// leak) until the restored store reached that version again, then with
// another key under the same version.
func TestJWTKeyOfAReplicaRunningAcrossARestore(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "muster.db")
	b := startReplicas(t, func(ctx context.Context) (store.Store, error) { return sqlite.Open(ctx, path) }, 1)
	r, ctx := b.srvs[0], t.Context()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rotateTo := func(to int64) {
		t.Helper()
		for {
			k, err := b.store.GetJWTKey(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if k.Version >= to {
				return
			}
			if _, err := r.rotateJWTKey(ctx, k, audit.Event{Actor: "authority", Reason: "the test rotates"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rotateTo(2)
	backupKID := r.jwt.Load().KeyID()
	var backup [5]any // version, rotated_at and the three salts
	if err := db.QueryRowContext(ctx, `SELECT version, rotated_at, prev_salt, salt, next_salt FROM jwt_svid_key`).
		Scan(&backup[0], &backup[1], &backup[2], &backup[3], &backup[4]); err != nil {
		t.Fatal(err)
	}
	// A read begun before a rotation this replica installed, answering
	// the version it replaced, is stale, not the store gone back.
	installs := r.jwtInstalls.Load()
	stale, err := b.store.GetJWTKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rotateTo(5)
	leaked := r.jwt.Load().KeyID()
	if err := r.useJWTKeyRead(stale, installs); err != nil || r.jwt.Load().KeyID() != leaked {
		t.Fatalf("a stale read of version %d made the replica sign with %s (%v), want %s", stale.Version, r.jwt.Load().KeyID(), err, leaked)
	}
	if _, err := db.ExecContext(ctx, `UPDATE jwt_svid_key SET version = ?, rotated_at = ?, prev_salt = ?, salt = ?, next_salt = ?`, backup[:]...); err != nil {
		t.Fatal(err)
	}
	if err := r.jwtKeyStepWith(ctx, 1000*time.Hour); err != nil {
		t.Fatal(err)
	}
	iss := r.jwt.Load()
	if iss.Version() != 2 || iss.KeyID() != backupKID {
		t.Fatalf("after the store went back to version 2 (%s), the running replica signs with version %d (%s); before the restore it signed with %s",
			backupKID, iss.Version(), iss.KeyID(), leaked)
	}
	jwks, err := iss.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(jwks), leaked) {
		t.Errorf("the running replica still publishes %s, the key of version 5 from before the restore: %s", leaked, jwks)
	}
}

// TestJWTKeyOfADamagedSalt: a jwt_svid_key row whose salt is not
// lowercase hexadecimal (a damaged or hand-edited store) does not stop
// the replica: it reads it (at start as at each step), leaves the
// version out of the JWKS, and refuses to sign with it naming the way
// out, muster ca rotate jwt with the authority's --data; once that runs,
// the next version signs and the damaged one is only the previous (left
// out too), then gone. Before, the replica refused to start, and a
// running one logged the bare error every 5 s and signed on with the
// version it had: the rotation it needed was never named.
func TestJWTKeyOfADamagedSalt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "muster.db")
	b := startReplicas(t, func(ctx context.Context) (store.Store, error) { return sqlite.Open(ctx, path) }, 1)
	r, ctx := b.srvs[0], t.Context()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	k, err := b.store.GetJWTKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.rotateJWTKey(ctx, k, audit.Event{Actor: "authority", Reason: "the test rotates"}); err != nil {
		t.Fatal(err)
	}
	// Damaged, and made current long ago, so the rotation is not refused
	// for the minimum period.
	if _, err := db.ExecContext(ctx, `UPDATE jwt_svid_key SET salt = 'Not-Hex!', rotated_at = rotated_at - 3600000000`); err != nil {
		t.Fatal(err)
	}
	if err := r.loadJWTKey(); err != nil {
		t.Fatalf("a replica starting on the damaged row: %v", err)
	}
	iss := r.jwt.Load()
	_, _, err = iss.Mint("spiffe://td/agent/n1", []string{"aud"}, time.Now(), time.Now().Add(time.Hour))
	if !errors.Is(err, jwtsvid.ErrSalt) || iss.KeyID() != "" {
		t.Fatalf("minting with the damaged version 2: %v (kid %q), want ErrSalt", err, iss.KeyID())
	}
	if why := r.jwtSaltWayOut(iss); !strings.Contains(why, "`muster ca rotate jwt --data ") || !strings.Contains(why, "version 2 signs no JWT-SVID") {
		t.Errorf("the way out: %s", why)
	}
	for kid, v := range iss.KeyVersions() {
		if v == 2 {
			t.Errorf("the damaged version 2 is published as %s", kid)
		}
	}
	resp, err := (&adminService{s: r}).rotateJWTKey(ctx)
	if err != nil || resp.GetVersion() != 3 || resp.GetKeyId() == "" || resp.GetPreviousKeyId() != "" {
		t.Fatalf("muster ca rotate jwt from the damaged version: %+v, %v", resp, err)
	}
	if err := r.jwtKeyStepWith(ctx, 1000*time.Hour); err != nil {
		t.Fatal(err)
	}
	iss = r.jwt.Load()
	if _, _, err := iss.Mint("spiffe://td/agent/n1", []string{"aud"}, time.Now(), time.Now().Add(time.Hour)); err != nil || iss.KeyID() != resp.GetKeyId() {
		t.Fatalf("after the rotation: signs with %q (%v), want %s", iss.KeyID(), err, resp.GetKeyId())
	}
}
