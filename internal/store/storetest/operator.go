package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func operator(serial, name string, age time.Duration) store.Operator {
	return store.Operator{
		Serial:    serial,
		Name:      name,
		SPIFFEID:  "spiffe://muster.test/operator/" + name,
		NotBefore: at(-age - time.Minute),
		NotAfter:  at(-age + 90*24*time.Hour),
		CreatedBy: "admin",
		CreatedAt: at(-age),
	}
}

func operatorCases() []testCase {
	return []testCase{
		{"empty list", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			if len(got) != 0 {
				t.Errorf("ListOperators on an empty store = %v, want none", got)
			}
		}},
		{"standing: a serial known for its name, and the lock on the name", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, operator("0a1", "alice", 0), link(record("operator.add"))))
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, operator("0b2", "bob", 0), link(record("operator.add"))))
			standing := func(serial, name string) store.OperatorStanding {
				t.Helper()
				st, err := s.ReadOperatorStanding(ctx, serial, name)
				mustNil(t, "ReadOperatorStanding "+serial+" "+name, err)
				return st
			}
			wantEqual(t, "standing of alice's serial", standing("0a1", "alice"), store.OperatorStanding{Known: true})
			// A store restored from an older backup: a serial it never recorded.
			wantEqual(t, "standing of an unrecorded serial", standing("0ff", "alice"), store.OperatorStanding{})
			// bob's serial does not vouch for alice.
			wantEqual(t, "standing of another name's serial", standing("0b2", "alice"), store.OperatorStanding{})
			locks := lockFixture(t, ctx, s)
			want, err := s.FindAnyLock(ctx, []store.LockTarget{{Kind: store.LockAdmin, Target: "alice"}})
			mustNil(t, "FindAnyLock", err)
			wantEqual(t, "FindAnyLock", want, locks["admin-live"])
			wantEqual(t, "standing of locked alice", standing("0a1", "alice"), store.OperatorStanding{Known: true, Lock: want, Locked: true})
			wantEqual(t, "standing of an unrecorded serial of locked alice", standing("0ff", "alice"), store.OperatorStanding{Lock: want, Locked: true})
			wantEqual(t, "standing of bob", standing("0b2", "bob"), store.OperatorStanding{Known: true})
		}},
		{"list oldest first with every field", func(t *testing.T, ctx context.Context, s store.Store) {
			ops := []store.Operator{
				operator("02ab", "bob", time.Hour),
				operator("01ff", "alice", 2*time.Hour),
				operator("03cd", "carol", 0),
			}
			for _, o := range ops {
				mustNil(t, "InsertOperator "+o.Serial, s.InsertOperator(ctx, o, link(record("operator.add"))))
			}
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{ops[1], ops[0], ops[2]})
		}},
		{"an operator is recorded with its audit record, or not at all", func(t *testing.T, ctx context.Context, s store.Store) {
			seq := auditSeq(t, ctx, s)
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, operator("01", "alice", 0), link(record("operator.add"))))
			wantErr(t, "InsertOperator while valid", s.InsertOperator(ctx, operator("02", "alice", 0), link(record("operator.add"))), store.ErrConflict)
			if got := auditSeq(t, ctx, s); got != seq+1 {
				t.Fatalf("audit chain holds %d records; want %d, the one operator recorded", got, seq+1)
			}
			all := func() any {
				got, err := s.ListOperators(ctx)
				mustNil(t, "ListOperators", err)
				return got
			}
			// A new name, and a reissue beside alice's valid certificate.
			reissue := operator("04", "alice", 0)
			reissue.Reissue = true
			for _, o := range []store.Operator{operator("03", "bob", 0), reissue} {
				wantUnaudited(t, ctx, s, "operator.add", func(audit func(store.AuditHead) (store.AuditRecord, error)) error {
					return s.InsertOperator(ctx, o, audit)
				}, all)
			}
			won := raceAppends(t, ctx, s, 6, func(i int) error {
				return s.InsertOperator(ctx, operator(fmt.Sprintf("1%d", i), "carol", 0), link(record("operator.add")))
			})
			if won != 1 {
				t.Fatalf("%d of 6 racing certificates of one name recorded; want 1", won)
			}
		}},
		{"duplicate serial conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			first := operator("0abc", "alice", time.Hour)
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, first, link(record("operator.add"))))
			err := s.InsertOperator(ctx, operator("0abc", "mallory", 0), link(record("operator.add")))
			wantErr(t, "InsertOperator duplicate", err, store.ErrConflict)
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{first})
		}},
		{"a name holds one valid certificate at a time", func(t *testing.T, ctx context.Context, s store.Store) {
			old := operator("01", "alice", 100*24*time.Hour) // expired 10 days ago
			mustNil(t, "InsertOperator expired", s.InsertOperator(ctx, old, link(record("operator.add"))))
			cur := operator("02", "alice", time.Hour)
			mustNil(t, "InsertOperator after expiry", s.InsertOperator(ctx, cur, link(record("operator.add"))))
			wantErr(t, "InsertOperator while valid", s.InsertOperator(ctx, operator("03", "alice", 0), link(record("operator.add"))), store.ErrConflict)
			mustNil(t, "InsertOperator other name", s.InsertOperator(ctx, operator("04", "bob", 0), link(record("operator.add"))))
			again := operator("05", "bob", 0)
			again.Reissue = true
			mustNil(t, "InsertOperator reissue", s.InsertOperator(ctx, again, link(record("operator.add"))))
			again.Reissue = false
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{old, cur, operator("04", "bob", 0), again})
		}},
		{"concurrent issues to one name: one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			errs := concurrently(n, func(i int) error {
				return s.InsertOperator(ctx, operator(fmt.Sprintf("%02x", i), "carol", 0), link(record("operator.add")))
			})
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, store.ErrConflict):
					t.Errorf("concurrent InsertOperator: %v, want nil or ErrConflict", err)
				}
			}
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			if won != 1 || len(got) != 1 {
				t.Fatalf("%d of %d concurrent inserts won, %d operators stored; want exactly one", won, n, len(got))
			}
		}},
	}
}
