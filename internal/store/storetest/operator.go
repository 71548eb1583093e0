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
		{"list oldest first with every field", func(t *testing.T, ctx context.Context, s store.Store) {
			ops := []store.Operator{
				operator("02ab", "bob", time.Hour),
				operator("01ff", "alice", 2*time.Hour),
				operator("03cd", "carol", 0),
			}
			for _, o := range ops {
				mustNil(t, "InsertOperator "+o.Serial, s.InsertOperator(ctx, o))
			}
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{ops[1], ops[0], ops[2]})
		}},
		{"duplicate serial conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			first := operator("0abc", "alice", time.Hour)
			mustNil(t, "InsertOperator", s.InsertOperator(ctx, first))
			err := s.InsertOperator(ctx, operator("0abc", "mallory", 0))
			wantErr(t, "InsertOperator duplicate", err, store.ErrConflict)
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{first})
		}},
		{"a name holds one valid certificate at a time", func(t *testing.T, ctx context.Context, s store.Store) {
			old := operator("01", "alice", 100*24*time.Hour) // expired 10 days ago
			mustNil(t, "InsertOperator expired", s.InsertOperator(ctx, old))
			cur := operator("02", "alice", time.Hour)
			mustNil(t, "InsertOperator after expiry", s.InsertOperator(ctx, cur))
			wantErr(t, "InsertOperator while valid", s.InsertOperator(ctx, operator("03", "alice", 0)), store.ErrConflict)
			mustNil(t, "InsertOperator other name", s.InsertOperator(ctx, operator("04", "bob", 0)))
			again := operator("05", "bob", 0)
			again.Reissue = true
			mustNil(t, "InsertOperator reissue", s.InsertOperator(ctx, again))
			again.Reissue = false
			got, err := s.ListOperators(ctx)
			mustNil(t, "ListOperators", err)
			wantEqual(t, "ListOperators", got, []store.Operator{old, cur, operator("04", "bob", 0), again})
		}},
		{"concurrent issues to one name: one wins", func(t *testing.T, ctx context.Context, s store.Store) {
			const n = 8
			errs := concurrently(n, func(i int) error {
				return s.InsertOperator(ctx, operator(fmt.Sprintf("%02x", i), "carol", 0))
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
