package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

func keyCustodyCases() []testCase {
	token := store.KeyCustody{URI: "pkcs11:token=muster", Module: "/usr/lib/softhsm/libsofthsm2.so"}
	return []testCase{
		{"custody is recorded once; the same token again changes nothing, another is refused", func(t *testing.T, ctx context.Context, s store.Store) {
			_, err := s.GetKeyCustody(ctx)
			wantErr(t, "GetKeyCustody on a fresh store", err, store.ErrNotFound)
			before := storeNow(t, ctx, s)
			seq := auditSeq(t, ctx, s)
			got, err := s.RecordKeyCustody(ctx, token, link(record("ca.migrate_custody")))
			mustNil(t, "RecordKeyCustody", err)
			wantEqual(t, "audit records after the token is recorded", auditSeq(t, ctx, s), seq+1)
			if got.URI != token.URI || got.Module != token.Module || got.RecordedAt.Before(before) {
				t.Fatalf("recorded %+v; want %+v at the store clock from %v", got, token, before)
			}
			if read, err := s.GetKeyCustody(ctx); err != nil || read != got {
				t.Fatalf("read back %+v (%v), want %+v", read, err, got)
			}
			// The same token from another machine (its module elsewhere):
			// what is recorded stays, and is returned.
			// It changes nothing, so it records nothing.
			again, err := s.RecordKeyCustody(ctx, store.KeyCustody{URI: token.URI, Module: "/opt/hsm/lib.so"}, link(record("ca.migrate_custody")))
			mustNil(t, "RecordKeyCustody of the same token", err)
			if again != got {
				t.Fatalf("a second record of the same token returned %+v, want %+v unchanged", again, got)
			}
			_, err = s.RecordKeyCustody(ctx, store.KeyCustody{URI: "pkcs11:token=other", Module: token.Module}, link(record("ca.migrate_custody")))
			wantErr(t, "RecordKeyCustody of another token", err, store.ErrConflict)
			if read, _ := s.GetKeyCustody(ctx); read != got {
				t.Fatalf("a refused record wrote: %+v", read)
			}
			wantErr(t, "ClearKeyCustody of another token", s.ClearKeyCustody(ctx, "pkcs11:token=other", link(record("ca.migrate_custody"))), store.ErrNotFound)
			if read, _ := s.GetKeyCustody(ctx); read != got {
				t.Fatalf("a refused clear removed %+v", read)
			}
			wantEqual(t, "audit records after a repeat and two refusals", auditSeq(t, ctx, s), seq+1)
			recorded := func() any { c, err := s.GetKeyCustody(ctx); return fmt.Sprint(c, err) }
			wantUnaudited(t, ctx, s, "ca.migrate_custody", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				return s.ClearKeyCustody(ctx, token.URI, audit)
			}, recorded)
			mustNil(t, "ClearKeyCustody", s.ClearKeyCustody(ctx, token.URI, link(record("ca.migrate_custody"))))
			wantEqual(t, "audit records after the clear", auditSeq(t, ctx, s), seq+2)
			_, err = s.GetKeyCustody(ctx)
			wantErr(t, "GetKeyCustody after the clear", err, store.ErrNotFound)
			wantErr(t, "ClearKeyCustody again", s.ClearKeyCustody(ctx, token.URI, link(record("ca.migrate_custody"))), store.ErrNotFound)
			// A token recorded unaudited is not recorded.
			wantUnaudited(t, ctx, s, "ca.migrate_custody", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
				_, err := s.RecordKeyCustody(ctx, store.KeyCustody{URI: "pkcs11:token=other", Module: token.Module}, audit)
				return err
			}, recorded)
			// Another token may be recorded after.
			_, err = s.RecordKeyCustody(ctx, store.KeyCustody{URI: "pkcs11:token=other", Module: token.Module}, link(record("ca.migrate_custody")))
			mustNil(t, "RecordKeyCustody after the clear", err)
			wantEqual(t, "audit records after the second token", auditSeq(t, ctx, s), seq+3)
		}},
		{"of concurrent records of different tokens exactly one wins, and only it is audited", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			seq := auditSeq(t, ctx, s)
			var (
				wg        sync.WaitGroup
				mu        sync.Mutex
				won, lost int
				winner    string
			)
			for i := range n {
				uri := "pkcs11:token=t" + string(rune('a'+i))
				wg.Go(func() {
					got, err := s.RecordKeyCustody(ctx, store.KeyCustody{URI: uri, Module: token.Module}, recordOf("ca.migrate_custody", uri))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won++
						winner = got.URI
					case errors.Is(err, store.ErrConflict):
						lost++
					default:
						t.Errorf("RecordKeyCustody: %v", err)
					}
				})
			}
			wg.Wait()
			if won != 1 || lost != n-1 {
				t.Fatalf("%d won, %d lost; want 1 and %d", won, lost, n-1)
			}
			if c, _ := s.GetKeyCustody(ctx); c.URI != winner {
				t.Fatalf("recorded %q, the winner was %q", c.URI, winner)
			}
			recs, err := s.ListAudit(ctx, store.AuditFilter{Action: "ca.migrate_custody"})
			mustNil(t, "ListAudit", err)
			if len(recs) != 1 || recs[0].Target != winner || auditSeq(t, ctx, s) != seq+1 {
				t.Fatalf("audit records %+v; want the winner's (%s) alone", recs, winner)
			}
		}},
	}
}

// recordOf is the link of a record of action on target.
func recordOf(action, target string) func(store.AuditHead) (store.AuditRecord, error) {
	r := record(action)
	r.Target = target
	return link(r)
}
