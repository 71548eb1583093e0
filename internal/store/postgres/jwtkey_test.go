package postgres

import "testing"

// TestJWTKeyRotationOfAnOldReplica: a replica of the release before
// migration 0028, still running during a rolling upgrade, rotates the
// version without moving the salts and signs with the new version's key
// derived from the version alone. The row then says so (no salt for the
// new version nor the next; the previous keeps its own), so the
// upgraded replicas sign and publish the keys it does.
func TestJWTKeyRotationOfAnOldReplica(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	k, err := s.GetJWTKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if k, err = s.RotateJWTKey(ctx, k, benchLink); err != nil {
			t.Fatal(err)
		}
	}
	if k.Salt == "" {
		t.Fatalf("after two rotations: %+v; want a salted current version", k)
	}
	// An old replica that read the row before an upgraded one rotated it
	// cannot write over the rotation: its write is conditional on what it
	// read (the release before 0028's on the version and its time, older
	// ones' on the version alone), and the upgraded replica's new key and
	// salts stay.
	read := k
	if k, err = s.RotateJWTKey(ctx, k, benchLink); err != nil {
		t.Fatal(err)
	}
	for _, stale := range []string{
		`UPDATE jwt_svid_key SET version = version + 1, rotated_at = rotated_at + 1 WHERE id = 1 AND version = $1 AND rotated_at = $2`,
		`UPDATE jwt_svid_key SET version = version + 1, rotated_at = rotated_at + 1 WHERE id = 1 AND version = $1 AND $2::bigint IS NOT NULL`,
	} {
		tag, err := s.pool.Exec(ctx, stale, read.Version, read.RotatedAt.UnixMicro())
		if err != nil {
			t.Fatal(err)
		}
		if tag.RowsAffected() != 0 {
			t.Fatalf("an old replica's rotation from version %d, read before the upgraded one's, wrote %d rows", read.Version, tag.RowsAffected())
		}
		if got, err := s.GetJWTKey(ctx); err != nil || got != k {
			t.Fatalf("after an old replica's stale rotation: %+v (%v), want the upgraded replica's %+v", got, err, k)
		}
	}
	// The release before 0028's rotation.
	if _, err := s.pool.Exec(ctx, `UPDATE jwt_svid_key SET version = version + 1, rotated_at = rotated_at + 1
		WHERE id = 1 AND version = $1 AND rotated_at = $2`, k.Version, k.RotatedAt.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	old, err := s.GetJWTKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if old.Version != k.Version+1 || old.PrevSalt != k.Salt || old.Salt != "" || old.NextSalt != "" {
		t.Fatalf("after an old replica's rotation from %+v: %+v; want the previous salt %q and none for the new version nor the next", k, old, k.Salt)
	}
	next, err := s.RotateJWTKey(ctx, old, benchLink)
	if err != nil {
		t.Fatal(err)
	}
	if next.Version != old.Version+1 || next.PrevSalt != "" || next.Salt != "" || next.NextSalt == "" {
		t.Fatalf("an upgraded replica's rotation from %+v: %+v; want the salts moved along and a next one drawn", old, next)
	}
}
