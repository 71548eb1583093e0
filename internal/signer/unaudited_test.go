package signer

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
)

var errChainDown = errors.New("the audit chain refuses the record (test)")

// refuseRecords makes log's records of changes fail (or pass again).
func (a *auditLog) refuseRecords(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refuse, a.refuseAction = nil, ""
	if on {
		a.refuse = errChainDown
	}
}

// signerRows is the store's signers and set ID, as text to compare.
func signerRows(t *testing.T, st Store) string {
	t.Helper()
	rows, id, err := st.ListSigners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%+v %+v", rows, id)
}

// chainActions lists the actions of the store's audit chain.
func chainActions(t *testing.T, st store.Store) []string {
	t.Helper()
	recs, err := st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Action)
	}
	return out
}

// TestStepUnauditedChangesNothing: a signer step (stage, activate,
// retire, revoke, rollback) whose node_task_signer record cannot be
// written changes no signer, moves no verifier set version and keeps a
// sealed key it would have destroyed; with its record, the step and the
// record are both in the store. Before, the step was written first and
// recorded after, the record's failure dropped.
func TestStepUnauditedChangesNothing(t *testing.T) {
	ctx := t.Context()
	k, st, log := newKeeper(t)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	unaudited := func(name string, step func() (Result, error)) {
		t.Helper()
		before, chain := signerRows(t, st), chainActions(t, st)
		log.refuseRecords(true)
		defer log.refuseRecords(false)
		if _, err := step(); !errors.Is(err, errChainDown) {
			t.Fatalf("%s with its record refused: %v; want the record's error", name, err)
		}
		if after := signerRows(t, st); after != before {
			t.Fatalf("%s with its record refused changed the signers:\n%s\nwant\n%s", name, after, before)
		}
		if got := chainActions(t, st); !slices.Equal(got, chain) {
			t.Fatalf("%s with its record refused: chain %q; want %q", name, got, chain)
		}
	}
	audited := func(name string, step func() (Result, error)) Result {
		t.Helper()
		chain := chainActions(t, st)
		res, err := step()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := chainActions(t, st); !slices.Equal(got, append(chain, "node_task_signer."+name)) {
			t.Fatalf("%s: chain %q; want its record added to %q", name, got, chain)
		}
		return res
	}
	stage := func() (Result, error) { return k.Stage(ctx, who, time.Hour, 24*time.Hour) }
	activate := func() (Result, error) { return k.Activate(ctx, who) }
	unaudited("stage", stage)
	audited("stage", stage)
	unaudited("rollback", func() (Result, error) { return k.Rollback(ctx, who) })
	unaudited("activate", activate)
	audited("activate", activate)
	// v1 is in grace: its sealed key goes with the retirement, or stays.
	unaudited("retire", func() (Result, error) { return k.Retire(ctx, who) })
	if len(refsOf(t, st)["v1"]) == 0 {
		t.Fatal("an unaudited retirement destroyed v1's key")
	}
	unaudited("revoke", func() (Result, error) { return k.Revoke(ctx, who, "v1") })
	audited("retire", func() (Result, error) { return k.Retire(ctx, who) })
	if len(refsOf(t, st)["v1"]) != 0 {
		t.Fatal("the audited retirement kept v1's key")
	}
}

// TestDestroyKeyUnauditedKeepsTheReference: an ended token signer's key
// whose node_task_signer.destroy_key record cannot be written keeps its
// reference for the next pass (the token object, destroyed or not, is
// destroyed again harmlessly); with its record, the reference goes and
// the record is in the store.
func TestDestroyKeyUnauditedKeepsTheReference(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	k, st, log := tokenKeeper(t, filepath.Join(t.TempDir(), "muster.db"), tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	res, err := k.Stage(ctx, who, time.Hour, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Changes[0].To.VersionID
	ref := refsOf(t, st)[id]
	// The rollback is recorded; its key's destruction is not: the object
	// goes, the reference stays, and the rollback says so.
	log.mu.Lock()
	log.refuse, log.refuseAction = errChainDown, "node_task_signer.destroy_key"
	log.mu.Unlock()
	res, err = k.Rollback(ctx, who)
	if err != nil || len(res.Keys) != 1 || !errors.Is(res.Keys[0].Err, errChainDown) {
		t.Fatalf("rollback with the key's record refused: %+v %v", res, err)
	}
	if got := refsOf(t, st)[id]; string(got) != string(ref) {
		t.Fatalf("the reference after an unaudited destruction: %q; want %q kept", got, ref)
	}
	if _, err := k.DestroyEnded(ctx, Actor{Name: "authority"}); !errors.Is(err, errChainDown) {
		t.Fatalf("DestroyEnded with the record refused: %v", err)
	}
	if got := refsOf(t, st)[id]; string(got) != string(ref) {
		t.Fatalf("the reference after an unaudited pass: %q; want %q kept", got, ref)
	}
	if got := chainActions(t, st); slices.Contains(got, "node_task_signer.destroy_key") {
		t.Fatalf("chain %q holds a destroy_key record for a reference kept", got)
	}
	log.refuseRecords(false)
	done, err := k.DestroyEnded(ctx, Actor{Name: "authority"})
	if err != nil || len(done) != 1 || done[0].VersionID != id {
		t.Fatalf("DestroyEnded with its record: %+v %v", done, err)
	}
	if got := refsOf(t, st)[id]; len(got) != 0 {
		t.Fatalf("the reference %q stayed after the audited pass", got)
	}
	if got := chainActions(t, st); got[len(got)-1] != "node_task_signer.destroy_key" {
		t.Fatalf("chain %q; want the destroy_key record last", got)
	}
}
