package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

// set builds a setting write's audit record, the chain's next link.
func set() func(store.AuditHead) (store.AuditRecord, error) { return link(record("setting.set")) }

// auditSeq is the chain's head's seq.
func auditSeq(t *testing.T, ctx context.Context, s store.Store) int64 {
	t.Helper()
	h, err := s.AuditHead(ctx)
	mustNil(t, "AuditHead", err)
	return h.Seq
}

func settingCases() []testCase {
	return []testCase{
		{"a fresh store holds no setting; the first value is recorded once, then changed by version", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			if len(got) != 0 {
				t.Fatalf("fresh store holds %+v; want none", got)
			}
			before := storeNow(t, ctx, s)
			first, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "10m0s", UpdatedBy: "authority", Version: 7}, store.Setting{}, set())
			mustNil(t, "PutSetting from 0", err)
			if first.Version != 1 || first.UpdatedAt.Before(before) || first.Value != "10m0s" || first.UpdatedBy != "authority" {
				t.Fatalf("first write: %+v; want version 1 at the store clock from %v", first, before)
			}
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "authority"}, store.Setting{}, set())
			wantErr(t, "PutSetting from 0 of a key held", err, store.ErrConflict)
			notHeld := first
			notHeld.Version = 2
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, notHeld, set())
			wantErr(t, "PutSetting from a version not held", err, store.ErrConflict)
			otherTime := first
			otherTime.UpdatedAt = otherTime.UpdatedAt.Add(-time.Millisecond)
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, otherTime, set())
			wantErr(t, "PutSetting from the version held written at another time", err, store.ErrConflict)
			_, err = s.PutSetting(ctx, store.Setting{Key: "ca.intermediate_ttl", Value: "1h0m0s", UpdatedBy: "admin:ops"}, first, set())
			wantErr(t, "PutSetting from 1 of a key not held", err, store.ErrConflict)
			got, err = s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "settings after refused writes", got, []store.Setting{first})

			second, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1m0s", UpdatedBy: "admin:ops"}, first, set())
			mustNil(t, "PutSetting from 1", err)
			if second.Version != 2 || second.UpdatedAt.Before(first.UpdatedAt) || second.Value != "1m0s" || second.UpdatedBy != "admin:ops" {
				t.Fatalf("second write: %+v; want version 2 by admin:ops", second)
			}
			other, err := s.PutSetting(ctx, store.Setting{Key: "ca.intermediate_ttl", Value: "1h0m0s", UpdatedBy: "authority"}, store.Setting{}, set())
			mustNil(t, "PutSetting of another key", err)
			got, err = s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "settings, by key", got, []store.Setting{other, second})
			// One record per write that won, none for those refused.
			if seq := auditSeq(t, ctx, s); seq != 3 {
				t.Fatalf("audit chain holds %d records after 3 writes and 4 refused; want 3", seq)
			}
		}},
		{"a write whose audit record cannot be built or appended changes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			held, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "10m0s", UpdatedBy: "authority"}, store.Setting{}, set())
			mustNil(t, "PutSetting", err)
			boom := errors.New("boom")
			failing := map[string]func(store.AuditHead) (store.AuditRecord, error){
				"build fails": func(store.AuditHead) (store.AuditRecord, error) { return store.AuditRecord{}, boom },
				"record off the chain": func(h store.AuditHead) (store.AuditRecord, error) {
					r, err := set()(h)
					r.PrevHash = []byte("not the head")
					return r, err
				},
				"record without a hash": func(h store.AuditHead) (store.AuditRecord, error) {
					r, err := set()(h)
					r.Hash = nil
					return r, err
				},
				"no record at all": nil,
			}
			for name, audit := range failing {
				for _, w := range []struct {
					key  string
					from store.Setting
				}{{"signer.min_lead_time", held}, {"ca.intermediate_ttl", store.Setting{}}} {
					_, err := s.PutSetting(ctx, store.Setting{Key: w.key, Value: "1h0m0s", UpdatedBy: "admin:ops"}, w.from, audit)
					if err == nil {
						t.Fatalf("%s: PutSetting of %s from %d succeeded", name, w.key, w.from.Version)
					}
					if name == "build fails" && !errors.Is(err, boom) {
						t.Errorf("%s: PutSetting = %v; want the build's error", name, err)
					}
				}
			}
			got, err := s.ListSettings(ctx)
			mustNil(t, "ListSettings", err)
			wantEqual(t, "settings after unaudited writes", got, []store.Setting{held})
			if seq := auditSeq(t, ctx, s); seq != 1 {
				t.Fatalf("audit chain holds %d records; want 1, the first write's", seq)
			}
			// The setting is still writable from the version held.
			_, err = s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "1h0m0s", UpdatedBy: "admin:ops"}, held, set())
			mustNil(t, "PutSetting after the failures", err)
		}},
		{"of concurrent writes from one version exactly one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			for _, fromVersion := range []int64{0, 1} {
				// The row held, as every writer read it.
				var from store.Setting
				if fromVersion == 1 {
					held, err := s.ListSettings(ctx)
					mustNil(t, "ListSettings", err)
					from = held[0]
				}
				var (
					wg     sync.WaitGroup
					mu     sync.Mutex
					winner string
					won    int
				)
				for i := range n {
					wg.Go(func() {
						v := string(rune('a' + i))
						_, err := s.PutSetting(ctx, store.Setting{Key: "ca.draft_ttl", Value: v, UpdatedBy: "authority"}, from, set())
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							won++
							winner = v
						case errors.Is(err, store.ErrConflict):
						default:
							t.Errorf("PutSetting from %d: %v", fromVersion, err)
						}
					})
				}
				wg.Wait()
				if won != 1 {
					t.Fatalf("from version %d: %d writes won; want 1", fromVersion, won)
				}
				got, err := s.ListSettings(ctx)
				mustNil(t, "ListSettings", err)
				if len(got) != 1 || got[0].Value != winner || got[0].Version != fromVersion+1 {
					t.Fatalf("from version %d: held %+v; want the winner's %q at version %d", fromVersion, got, winner, fromVersion+1)
				}
				if seq := auditSeq(t, ctx, s); seq != fromVersion+1 {
					t.Fatalf("from version %d: audit chain holds %d records; want %d, one per write won", fromVersion, seq, fromVersion+1)
				}
			}
		}},
	}
}
