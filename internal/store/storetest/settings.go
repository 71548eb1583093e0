package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

func settingCases() []testCase {
	return []testCase{
		{"a fresh store holds no setting; the first value is recorded once, then changed by version", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			if len(got) != 0 {
				t.Fatalf("fresh store holds %+v; want none", got)
			}
			before := storeNow(t, ctx, s)
			first, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "10m0s", UpdatedBy: "authority", Version: 7}, 0)
			mustNil(t, "PutSetting from 0", err)
			if first.Version != 1 || first.UpdatedAt.Before(before) || first.Value != "10m0s" || first.UpdatedBy != "authority" {
				t.Fatalf("first write: %+v; want version 1 at the store clock from %v", first, before)
			}
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "authority"}, 0)
			wantErr(t, "PutSetting from 0 of a key held", err, store.ErrConflict)
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, 2)
			wantErr(t, "PutSetting from a version not held", err, store.ErrConflict)
			_, err = s.PutSetting(ctx, store.Setting{Key: "ca.intermediate_ttl", Value: "1h0m0s", UpdatedBy: "admin:ops"}, 1)
			wantErr(t, "PutSetting from 1 of a key not held", err, store.ErrConflict)
			got, err = s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "settings after refused writes", got, []store.Setting{first})

			second, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, 1)
			mustNil(t, "PutSetting from 1", err)
			if second.Version != 2 || second.UpdatedAt.Before(first.UpdatedAt) || second.Value != "1m0s" || second.UpdatedBy != "admin:ops" {
				t.Fatalf("second write: %+v; want version 2 by admin:ops", second)
			}
			other, err := s.PutSetting(ctx, store.Setting{Key: "ca.intermediate_ttl", Value: "1h0m0s", UpdatedBy: "authority"}, 0)
			mustNil(t, "PutSetting of another key", err)
			got, err = s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "settings, by key", got, []store.Setting{other, second})
		}},
		{"of concurrent writes from one version exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			for _, from := range []int64{0, 1} {
				var (
					wg     sync.WaitGroup
					mu     sync.Mutex
					winner string
					won    int
				)
				for i := range n {
					wg.Go(func() {
						v := string(rune('a' + i))
						_, err := s.PutSetting(ctx, store.Setting{Key: "ca.draft_ttl", Value: v, UpdatedBy: "authority"}, from)
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							won++
							winner = v
						case errors.Is(err, store.ErrConflict):
						default:
							t.Errorf("PutSetting from %d: %v", from, err)
						}
					})
				}
				wg.Wait()
				if won != 1 {
					t.Fatalf("from version %d: %d writes won; want 1", from, won)
				}
				got, err := s.ListSettings(ctx)
				mustNil(t, "ListSettings", err)
				if len(got) != 1 || got[0].Value != winner || got[0].Version != from+1 {
					t.Fatalf("from version %d: held %+v; want the winner's %q at version %d", from, got, winner, from+1)
				}
			}
		}},
	}
}
