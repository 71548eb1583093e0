package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

const (
	authorityA = "prod-a3f2e1"
	rootA      = "sha256:a3f2e1aa"
	rootB      = "sha256:b4c5d6bb"
)

// registration is a registration of authority id under root, at version,
// with document doc and a signature of it.
func registration(id, root string, version int64, doc string) store.Registration {
	return store.Registration{
		AuthorityID: id, RootFingerprint: root, Version: version,
		Document: []byte(doc), Signature: []byte("signature of " + doc),
	}
}

// stored is r as PutRegistration stores it, registered at registered and
// updated at updated.
func stored(r store.Registration, registered, updated time.Time) store.Registration {
	r.RegisteredAt, r.UpdatedAt = registered, updated
	return r
}

func mustRegister(t *testing.T, ctx context.Context, s store.Store, r store.Registration) store.Registration {
	t.Helper()
	got, changed, err := s.PutRegistration(ctx, r, registerLink)
	mustNil(t, fmt.Sprintf("PutRegistration v%d", r.Version), err)
	if !changed {
		t.Fatalf("PutRegistration v%d: changed false, want true", r.Version)
	}
	return got
}

func wantRegistration(t *testing.T, ctx context.Context, s store.Store, want store.Registration) {
	t.Helper()
	got, err := s.GetRegistration(ctx, want.AuthorityID)
	mustNil(t, "GetRegistration", err)
	wantEqual(t, "GetRegistration", got, want)
}

func registrationCases() []testCase {
	cases := []testCase{
		{"an unaudited registration writes nothing; a repeat records nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRegister(t, ctx, s, registration(authorityA, rootA, 1, `{"v":1}`))
			all := func() any {
				a, errA := s.GetRegistration(ctx, authorityA)
				_, errB := s.GetRegistration(ctx, "lab-b4c5d6")
				return fmt.Sprintf("%+v %v %v", a, errA, errB)
			}
			for _, r := range []store.Registration{registration(authorityA, rootA, 2, `{"v":2}`), registration("lab-b4c5d6", rootB, 1, `{"v":1}`)} {
				wantUnaudited(t, ctx, s, "authority.register", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
					_, _, err := s.PutRegistration(ctx, r, func(got store.Registration) func(store.AuditHead) (store.AuditRecord, error) {
						if got.AuthorityID != r.AuthorityID || got.Version != r.Version {
							t.Errorf("the record was asked for with %+v, want the registration written", got)
						}
						return audit
					})
					return err
				}, all)
			}
			seq := auditSeq(t, ctx, s)
			_, changed, err := s.PutRegistration(ctx, registration(authorityA, rootA, 1, `{"v":1}`), func(store.Registration) func(store.AuditHead) (store.AuditRecord, error) {
				t.Error("a repeated registration asked for a record")
				return link(record("authority.register"))
			})
			mustNil(t, "PutRegistration repeat", err)
			wantEqual(t, "a repeat changed", changed, false)
			mustRegister(t, ctx, s, registration(authorityA, rootA, 2, `{"v":2}`))
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records after a repeat and an update; want %d", got, seq+1)
			}
		}},
		{"inserts a new authority ID by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			before := storeNow(t, ctx, s)
			r := registration(authorityA, rootA, 1, `{"v":1}`)
			r.RegisteredAt, r.UpdatedAt = at(-time.Hour), at(-time.Hour) // ignored
			got, changed, err := s.PutRegistration(ctx, r, registerLink)
			mustNil(t, "PutRegistration", err)
			after := storeNow(t, ctx, s)
			if !changed {
				t.Error("PutRegistration of a new ID: changed false, want true")
			}
			within(t, "RegisteredAt", got.RegisteredAt, before, after)
			if !got.UpdatedAt.Equal(got.RegisteredAt) {
				t.Errorf("UpdatedAt %v, want RegisteredAt %v", got.UpdatedAt, got.RegisteredAt)
			}
			want := stored(r, got.RegisteredAt, got.RegisteredAt)
			wantEqual(t, "PutRegistration", got, want)
			wantRegistration(t, ctx, s, want)
		}},
		{"identical repeat changes nothing", func(t *testing.T, ctx context.Context, s store.Store) {
			first := mustRegister(t, ctx, s, registration(authorityA, rootA, 3, `{"v":3}`))
			time.Sleep(5 * time.Millisecond)
			// The signature is not compared: the document is what counts.
			r := registration(authorityA, rootA, 3, `{"v":3}`)
			r.Signature = []byte("another signature")
			got, changed, err := s.PutRegistration(ctx, r, registerLink)
			mustNil(t, "PutRegistration repeat", err)
			if changed {
				t.Error("PutRegistration repeat: changed true, want false")
			}
			wantEqual(t, "PutRegistration repeat", got, first)
			wantRegistration(t, ctx, s, first)
		}},
		{"higher version replaces and keeps RegisteredAt", func(t *testing.T, ctx context.Context, s store.Store) {
			first := mustRegister(t, ctx, s, registration(authorityA, rootA, 1, `{"v":1}`))
			time.Sleep(5 * time.Millisecond)
			before := storeNow(t, ctx, s)
			r := registration(authorityA, rootA, 5, `{"v":5}`)
			got := mustRegister(t, ctx, s, r)
			after := storeNow(t, ctx, s)
			within(t, "UpdatedAt", got.UpdatedAt, before, after)
			if !got.UpdatedAt.After(first.UpdatedAt) {
				t.Errorf("UpdatedAt %v, want after the first registration's %v", got.UpdatedAt, first.UpdatedAt)
			}
			want := stored(r, first.RegisteredAt, got.UpdatedAt)
			wantEqual(t, "PutRegistration v5", got, want)
			wantRegistration(t, ctx, s, want)
		}},
		{"unknown authority ID is not found", func(t *testing.T, ctx context.Context, s store.Store) {
			mustRegister(t, ctx, s, registration(authorityA, rootA, 1, `{"v":1}`))
			_, err := s.GetRegistration(ctx, "other-000000")
			wantErr(t, "GetRegistration", err, store.ErrNotFound)
		}},
		{"delete frees the ID for another root and keeps the join reports", func(t *testing.T, ctx context.Context, s store.Store) {
			first := mustRegister(t, ctx, s, registration(authorityA, rootA, 3, `{"v":3}`))
			other := mustRegister(t, ctx, s, registration("test-b4c5d6", rootB, 1, `{"b":1}`))
			if _, err := s.RecordJoinReport(ctx, store.JoinReport{AuthorityID: authorityA, ReportID: "i1", NodeID: "n1", TicketID: "t1", JoinedAt: at(0)}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			mustNil(t, "DeleteRegistration", s.DeleteRegistration(ctx, authorityA))
			_, err := s.GetRegistration(ctx, authorityA)
			wantErr(t, "GetRegistration after the delete", err, store.ErrNotFound)
			wantErr(t, "DeleteRegistration again", s.DeleteRegistration(ctx, authorityA), store.ErrNotFound)
			wantRegistration(t, ctx, s, other)

			// Another root, and a version below the deleted one: a new
			// registration, registered now.
			r := registration(authorityA, rootB, 1, `{"v":1}`)
			got := mustRegister(t, ctx, s, r)
			if !got.RegisteredAt.After(first.RegisteredAt) || !got.UpdatedAt.Equal(got.RegisteredAt) {
				t.Errorf("re-registration registered %v, updated %v; want a new registration after %v", got.RegisteredAt, got.UpdatedAt, first.RegisteredAt)
			}
			wantRegistration(t, ctx, s, stored(r, got.RegisteredAt, got.RegisteredAt))
			// The new root is locked in turn.
			_, _, err = s.PutRegistration(ctx, registration(authorityA, rootA, 4, `{"v":4}`), registerLink)
			wantErr(t, "PutRegistration under the deleted root", err, store.ErrRootMismatch)
			if n, err := s.CountJoinReports(ctx, authorityA, time.Hour); err != nil || n != 1 {
				t.Errorf("CountJoinReports after the delete = %d, %v; want the report kept", n, err)
			}
		}},
		{"delete of an unknown ID is not found", func(t *testing.T, ctx context.Context, s store.Store) {
			a := mustRegister(t, ctx, s, registration(authorityA, rootA, 1, `{"v":1}`))
			wantErr(t, "DeleteRegistration", s.DeleteRegistration(ctx, "other-000000"), store.ErrNotFound)
			wantRegistration(t, ctx, s, a)
		}},
		{"registrations are kept per authority ID", func(t *testing.T, ctx context.Context, s store.Store) {
			a := mustRegister(t, ctx, s, registration(authorityA, rootA, 7, `{"a":7}`))
			b := mustRegister(t, ctx, s, registration("test-b4c5d6", rootB, 1, `{"b":1}`))
			wantRegistration(t, ctx, s, a)
			wantRegistration(t, ctx, s, b)
		}},
	}

	// Each refusal meets v2 of authorityA under rootA, which must stay as
	// it is.
	refusals := []struct {
		name string
		r    store.Registration
		want error
	}{
		{"lower version", registration(authorityA, rootA, 1, `{"v":1}`), store.ErrStaleVersion},
		{"lower version with the same document", registration(authorityA, rootA, 1, `{"v":2}`), store.ErrStaleVersion},
		{"same version, another document", registration(authorityA, rootA, 2, `{"v":2,"x":1}`), store.ErrStaleVersion},
		{"another root, higher version", registration(authorityA, rootB, 3, `{"v":3}`), store.ErrRootMismatch},
		{"another root, identical document", registration(authorityA, rootB, 2, `{"v":2}`), store.ErrRootMismatch},
	}
	for _, rf := range refusals {
		cases = append(cases, testCase{"refuses " + rf.name, func(t *testing.T, ctx context.Context, s store.Store) {
			first := mustRegister(t, ctx, s, registration(authorityA, rootA, 2, `{"v":2}`))
			got, changed, err := s.PutRegistration(ctx, rf.r, registerLink)
			wantErr(t, "PutRegistration", err, rf.want)
			if changed {
				t.Error("refused PutRegistration: changed true")
			}
			wantEqual(t, "refused PutRegistration", got, store.Registration{})
			wantRegistration(t, ctx, s, first)
		}})
	}

	return append(cases, testCase{"concurrent registrations of one version: exactly one stored", func(t *testing.T, ctx context.Context, s store.Store) {
		// Pairs share a document, so a loser may find its own document
		// stored: that is a repeat, not a refusal.
		const n = 8
		doc := func(i int) []byte { return []byte(fmt.Sprintf(`{"doc":%d}`, i/2)) }
		type outcome struct {
			reg     store.Registration
			changed bool
		}
		outs := make([]outcome, n)
		errs := concurrently(n, func(i int) error {
			r := registration(authorityA, rootA, 1, string(doc(i)))
			var err error
			outs[i].reg, outs[i].changed, err = s.PutRegistration(ctx, r, registerLink)
			return err
		})
		got, err := s.GetRegistration(ctx, authorityA)
		mustNil(t, "GetRegistration", err)
		winners := 0
		for i, err := range errs {
			switch {
			case err == nil && outs[i].changed:
				winners++
				wantEqual(t, fmt.Sprintf("registration %d", i), outs[i].reg, got)
			case err == nil:
				if !bytes.Equal(doc(i), got.Document) {
					t.Errorf("registration %d (%s) was a repeat of the stored %s", i, doc(i), got.Document)
				}
				wantEqual(t, fmt.Sprintf("repeat %d", i), outs[i].reg, got)
			case !errors.Is(err, store.ErrStaleVersion):
				t.Errorf("registration %d: %v, want nil or ErrStaleVersion", i, err)
			case bytes.Equal(doc(i), got.Document):
				t.Errorf("registration %d: %v, but its document is the stored one", i, err)
			}
		}
		if winners != 1 {
			t.Errorf("%d registrations were stored, want exactly 1", winners)
		}
	}})
}

func joinReportCases() []testCase {
	report := func(authority, id string) store.JoinReport {
		return store.JoinReport{
			AuthorityID: authority, ReportID: id, NodeID: "node-" + id, TicketID: "jti-" + id,
			JoinedAt: at(0), ReportedAt: at(-time.Hour), // ReportedAt is ignored
		}
	}
	put := func(t *testing.T, ctx context.Context, s store.Store, r store.JoinReport, want bool) {
		t.Helper()
		inserted, err := s.RecordJoinReport(ctx, r)
		mustNil(t, "RecordJoinReport "+r.ReportID, err)
		if inserted != want {
			t.Errorf("RecordJoinReport %s/%s: inserted %v, want %v", r.AuthorityID, r.ReportID, inserted, want)
		}
	}
	count := func(t *testing.T, ctx context.Context, s store.Store, authority string, window time.Duration, want int64) {
		t.Helper()
		n, err := s.CountJoinReports(ctx, authority, window)
		mustNil(t, "CountJoinReports", err)
		if n != want {
			t.Errorf("CountJoinReports(%s, %v) = %d, want %d", authority, window, n, want)
		}
	}
	remove := func(t *testing.T, ctx context.Context, s store.Store, olderThan time.Duration, want int64) {
		t.Helper()
		n, err := s.DeleteJoinReports(ctx, olderThan)
		mustNil(t, "DeleteJoinReports", err)
		if n != want {
			t.Errorf("DeleteJoinReports(%v) = %d, want %d", olderThan, n, want)
		}
	}
	const other = "test-b4c5d6"
	return []testCase{
		{"a replayed report is counted once", func(t *testing.T, ctx context.Context, s store.Store) {
			count(t, ctx, s, authorityA, time.Hour, 0)
			put(t, ctx, s, report(authorityA, "i1"), true)
			put(t, ctx, s, report(authorityA, "i1"), false)
			r := report(authorityA, "i1")
			r.NodeID = "node-other" // the key is (authority, report), nothing else
			put(t, ctx, s, r, false)
			put(t, ctx, s, report(authorityA, "i2"), true)
			put(t, ctx, s, report(other, "i1"), true)
			count(t, ctx, s, authorityA, time.Hour, 2)
			count(t, ctx, s, other, time.Hour, 1)
			count(t, ctx, s, "unknown-000000", time.Hour, 0)
		}},
		{"count and delete by the store clock", func(t *testing.T, ctx context.Context, s store.Store) {
			// old is recorded before mid, recent after it: a window
			// reaching back to mid tells them apart. The window is read
			// from the store's clock just before each call, and the gaps
			// absorb the time between that reading and the call (a
			// loaded machine took more than 100 ms once).
			const gap = time.Second
			put(t, ctx, s, report(authorityA, "old"), true)
			put(t, ctx, s, report(other, "old"), true)
			time.Sleep(gap)
			mid := storeNow(t, ctx, s)
			time.Sleep(gap)
			put(t, ctx, s, report(authorityA, "recent"), true)
			sinceMid := func() time.Duration { return storeNow(t, ctx, s).Sub(mid) }

			count(t, ctx, s, authorityA, time.Hour, 2)
			count(t, ctx, s, authorityA, sinceMid(), 1)
			count(t, ctx, s, other, sinceMid(), 0)
			remove(t, ctx, s, time.Hour, 0)
			remove(t, ctx, s, sinceMid(), 2) // both "old"
			count(t, ctx, s, authorityA, time.Hour, 1)
			count(t, ctx, s, other, time.Hour, 0)
			// A report deleted is forgotten: recording it again counts.
			put(t, ctx, s, report(authorityA, "old"), true)
			time.Sleep(5 * time.Millisecond)
			remove(t, ctx, s, 0, 2)
			count(t, ctx, s, authorityA, time.Hour, 0)
		}},
	}
}
