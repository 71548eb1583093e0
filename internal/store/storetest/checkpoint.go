package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

func checkpoint(seq int64) store.AuditCheckpoint {
	return store.AuditCheckpoint{
		Seq:       seq,
		Hash:      linkHash([]byte{byte(seq)}, seq),
		Time:      at(time.Duration(seq) * time.Second),
		KeyID:     fmt.Sprintf("key-%d", seq%2),
		Signature: []byte{0, byte(seq), 0xff},
	}
}

func checkpointCases() []testCase {
	return []testCase{
		{"empty list", func(t *testing.T, ctx context.Context, s store.Store) {
			got, err := s.ListAuditCheckpoints(ctx)
			mustNil(t, "ListAuditCheckpoints", err)
			if len(got) != 0 {
				t.Errorf("ListAuditCheckpoints on an empty store = %v, want none", got)
			}
		}},
		{"list ascending with every field", func(t *testing.T, ctx context.Context, s store.Store) {
			for _, seq := range []int64{30, 10, 20} {
				mustNil(t, "InsertAuditCheckpoint", s.InsertAuditCheckpoint(ctx, checkpoint(seq)))
			}
			got, err := s.ListAuditCheckpoints(ctx)
			mustNil(t, "ListAuditCheckpoints", err)
			wantEqual(t, "ListAuditCheckpoints", got,
				[]store.AuditCheckpoint{checkpoint(10), checkpoint(20), checkpoint(30)})
		}},
		{"duplicate seq conflicts", func(t *testing.T, ctx context.Context, s store.Store) {
			mustNil(t, "InsertAuditCheckpoint", s.InsertAuditCheckpoint(ctx, checkpoint(10)))
			dup := checkpoint(10)
			dup.KeyID, dup.Signature = "other", []byte("other")
			err := s.InsertAuditCheckpoint(ctx, dup)
			wantErr(t, "InsertAuditCheckpoint duplicate", err, store.ErrConflict)
			got, err := s.ListAuditCheckpoints(ctx)
			mustNil(t, "ListAuditCheckpoints", err)
			wantEqual(t, "ListAuditCheckpoints", got, []store.AuditCheckpoint{checkpoint(10)})
		}},
	}
}
