package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func jwtKeyCases() []testCase {
	return []testCase{
		{"a fresh store signs with version 1; a rotation is one conditional write", func(t *testing.T, ctx context.Context, s store.Store) {
			k, err := s.GetJWTKey(ctx)
			mustNil(t, "GetJWTKey", err)
			if k.Version != 1 || k.RotatedAt.IsZero() {
				t.Fatalf("fresh store: %+v; want version 1 with a start time", k)
			}
			before := storeNow(t, ctx, s)
			got, err := s.RotateJWTKey(ctx, k, link(record("jwt.rotate")))
			mustNil(t, "RotateJWTKey", err)
			if got.Version != 2 || got.RotatedAt.Before(before) {
				t.Fatalf("after the rotation: %+v; want version 2 at the store clock from %v", got, before)
			}
			if read, err := s.GetJWTKey(ctx); err != nil || read != got {
				t.Fatalf("read back %+v (%v), want %+v", read, err, got)
			}
			// The salts move along; the next one is drawn anew, never
			// one held before.
			if k.Salt != "" || k.PrevSalt != "" || k.NextSalt != "" {
				t.Fatalf("fresh store: salts %+v; want none (keys derived from the version alone)", k)
			}
			if got.PrevSalt != k.Salt || got.Salt != k.NextSalt || !hexSalt(got.NextSalt) {
				t.Fatalf("after the rotation from %+v: %+v; want the salts moved along and a new next one", k, got)
			}
			third, err := s.RotateJWTKey(ctx, got, link(record("jwt.rotate")))
			mustNil(t, "RotateJWTKey", err)
			if third.Version != 3 || third.PrevSalt != got.Salt || third.Salt != got.NextSalt || !hexSalt(third.NextSalt) || third.NextSalt == got.NextSalt {
				t.Fatalf("after the rotation from %+v: %+v; want the salts moved along and a new next one", got, third)
			}
			k, got = got, third
			_, err = s.RotateJWTKey(ctx, k, link(record("jwt.rotate")))
			wantErr(t, "RotateJWTKey from a version no longer current", err, store.ErrConflict)
			other := got
			other.RotatedAt = other.RotatedAt.Add(-time.Millisecond)
			_, err = s.RotateJWTKey(ctx, other, link(record("jwt.rotate")))
			wantErr(t, "RotateJWTKey from the current version made current at another time", err, store.ErrConflict)
			if read, _ := s.GetJWTKey(ctx); read != got {
				t.Fatalf("a refused rotation wrote: %+v", read)
			}
		}},
		{"of concurrent rotations from one version exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			from, err := s.GetJWTKey(ctx)
			mustNil(t, "GetJWTKey", err)
			var (
				wg        sync.WaitGroup
				mu        sync.Mutex
				won, lost int
			)
			for range n {
				wg.Go(func() {
					_, err := s.RotateJWTKey(ctx, from, link(record("jwt.rotate")))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won++
					case errors.Is(err, store.ErrConflict):
						lost++
					default:
						t.Errorf("RotateJWTKey: %v", err)
					}
				})
			}
			wg.Wait()
			if won != 1 || lost != n-1 {
				t.Fatalf("%d won, %d lost; want 1 and %d", won, lost, n-1)
			}
			if k, _ := s.GetJWTKey(ctx); k.Version != 2 {
				t.Fatalf("version %d after the race, want 2", k.Version)
			}
		}},
		{"an unaudited rotation changes nothing; an audited one writes its record", func(t *testing.T, ctx context.Context, s store.Store) {
			key := func() any {
				k, err := s.GetJWTKey(ctx)
				mustNil(t, "GetJWTKey", err)
				return k
			}
			from := key().(store.JWTKey)
			wantUnaudited(t, ctx, s, "jwt.rotate", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.RotateJWTKey(ctx, from, audit)
				return err
			}, key)
			seq := auditSeq(t, ctx, s)
			got, err := s.RotateJWTKey(ctx, from, link(record("jwt.rotate")))
			mustNil(t, "RotateJWTKey with its record", err)
			wantEqual(t, "the key after the audited rotation", key(), any(got))
			wantAppended(t, ctx, s, seq, "jwt.rotate")
			// A rotation that lost (from a version no longer current)
			// writes no record.
			_, err = s.RotateJWTKey(ctx, from, link(record("jwt.rotate")))
			wantErr(t, "RotateJWTKey from a version no longer current", err, store.ErrConflict)
			wantAppended(t, ctx, s, seq, "jwt.rotate")
		}},
	}
}

// hexSalt: a drawn salt, 128 bits in lowercase hexadecimal.
func hexSalt(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
