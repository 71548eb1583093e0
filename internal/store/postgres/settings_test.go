package postgres

import (
	"errors"
	"testing"

	"github.com/muster-dev/muster/internal/store"
)

// TestPutSettingAuditRefusedByDatabase: an audit record the database
// itself refuses (a reason that is not UTF-8, which a text column does
// not take) fails the write, and the setting stays as it was: the
// record's insert and the setting's write are one transaction.
func TestPutSettingAuditRefusedByDatabase(t *testing.T) {
	ctx := t.Context()
	s, _ := openFresh(t)
	held, err := s.PutSetting(ctx, store.Setting{Key: "signer.min_lead_time", Value: "10m0s", UpdatedBy: "authority"}, store.Setting{}, benchLink)
	if err != nil {
		t.Fatal(err)
	}
	bad := func(h store.AuditHead) (store.AuditRecord, error) {
		r, err := benchLink(h)
		r.Reason = "\xff\xfe"
		return r, err
	}
	for _, from := range []store.Setting{held, {}} {
		key := "signer.min_lead_time"
		if from.Version == 0 {
			key = "ca.draft_ttl"
		}
		if _, err := s.PutSetting(ctx, store.Setting{Key: key, Value: "1h0m0s", UpdatedBy: "admin:ops"}, from, bad); err == nil {
			t.Fatalf("PutSetting of %s from %d with a record the database refuses succeeded", key, from.Version)
		}
	}
	got, err := s.ListSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != held {
		t.Fatalf("settings after refused records: %+v; want only %+v", got, held)
	}
	if head, err := s.AuditHead(ctx); err != nil || head.Seq != 1 {
		t.Fatalf("AuditHead = %d, %v; want 1, the first write's record", head.Seq, err)
	}
}

// TestPutSettingTwoHandles: two replicas set one setting from the same
// versions while both append to the audit chain: each round exactly one
// write wins, with exactly one record, and the chain stays whole.
func TestPutSettingTwoHandles(t *testing.T) {
	ctx := t.Context()
	h := twoHandles(t)
	const rounds, writers, appends = 5, 6, 4
	for round := range int64(rounds) {
		var from store.Setting // the row every writer read
		if round > 0 {
			held, err := h[0].ListSettings(ctx)
			if err != nil || len(held) != 1 {
				t.Fatalf("ListSettings = %+v, %v; want the one row", held, err)
			}
			from = held[0]
		}
		won, errs := raceWrites(ctx, h, writers, appends, func(i int) error {
			_, err := h[i%2].PutSetting(ctx, store.Setting{Key: "ca.draft_ttl", Value: "1h0m0s", UpdatedBy: "admin:ops"}, from, benchLink)
			return err
		}, store.ErrConflict)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if won != 1 {
			t.Fatalf("from version %d: %d writes won; want 1", from.Version, won)
		}
	}
	recs, err := h[0].ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := rounds * (1 + appends); len(recs) != want {
		t.Fatalf("chain holds %d records; want %d (one per write won, and the appends)", len(recs), want)
	}
	checkBenchChain(t, recs)
	got, err := h[1].ListSettings(ctx)
	if err != nil || len(got) != 1 || got[0].Version != rounds {
		t.Fatalf("ListSettings = %+v, %v; want ca.draft_ttl at version %d", got, err, rounds)
	}
}
