package signer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/custody"
	"github.com/muster-dev/muster/internal/store"
)

// errLostApply is a store's answer to a write whose connection went as
// the database committed: it may or may not have landed.
var errLostApply = errors.New("postgres: apply signer changes: commit: unexpected EOF")

// applyFailing answers ApplySignerChanges with err, having written the
// changes first when land is set, and taken the token away when away is
// set (the key made for the write then cannot be destroyed).
type applyFailing struct {
	Store
	err  error
	land bool
	away *memToken
}

func (s *applyFailing) ApplySignerChanges(ctx context.Context, v store.SignerSetID, changes []store.SignerChange, audit func(store.AuditHead) (store.AuditRecord, error)) (int64, error) {
	if s.away != nil {
		s.away.setDown(true)
	}
	if s.land {
		if _, err := s.Store.ApplySignerChanges(ctx, v, changes, audit); err != nil {
			return 0, err
		}
	}
	return 0, s.err
}

// TestFailedStageLeavesNothingInTheToken: a stage whose write fails (a
// conflict with another replica's step, a store that fails) destroys the
// key it made in the token, so no object is left that no row names; a
// write whose answer was lost but which landed keeps its key, which the
// staged signer's row names. Before, every failed stage left its key in
// the token for good.
func TestFailedStageLeavesNothingInTheToken(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		land bool
		kept bool
	}{
		{"conflict", store.ErrConflict, false, false},
		{"store unavailable", store.ErrUnavailable, false, false},
		{"answer lost, not landed", errLostApply, false, false},
		{"answer lost, landed", errLostApply, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
			k, cs, log := tokenKeeper(t, filepath.Join(t.TempDir(), "muster.db"), tok)
			who := Actor{Name: "spiffe://td/admin/ops"}
			if _, err := k.EnsureFirst(ctx, who); err != nil {
				t.Fatal(err)
			}
			before := tok.count()
			failing := NewKeeper(&applyFailing{Store: cs, err: tc.err, land: tc.land}, k.custody, log, "prod-a3f2e1", 0)
			if _, err := failing.Stage(ctx, who, time.Hour, 24*time.Hour); !errors.Is(err, tc.err) {
				t.Fatalf("Stage = %v, want %v", err, tc.err)
			}
			after := tok.count()
			refs := refsOf(t, cs)
			if tc.kept {
				if after != before+1 {
					t.Fatalf("%d keys in the token after a stage that landed, want %d", after, before+1)
				}
				for id, ref := range refs {
					if strings.HasPrefix(id, "v2-") && !tok.holds(ref) {
						t.Fatalf("the staged signer %s's key is not in the token", id)
					}
				}
				return
			}
			if after != before {
				t.Fatalf("%d keys in the token after a failed stage, want %d (its key left behind)", after, before)
			}
			if len(refs) != 1 {
				t.Fatalf("signers %v after a failed stage, want the first alone", refs)
			}
		})
	}
}

// count is the number of keys in the token.
func (m *memToken) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

// TestFailedStageNamesTheKeyItCannotDestroy: a stage whose write fails
// while the token stops answering cannot destroy the key it made: the
// refusal names the pkcs11-tool commands that delete that key (module of
// the token, label, CKA_ID, class), in full. Before, it said
// "pkcs11-tool --delete-object --label muster-signer/vN", which
// pkcs11-tool cannot run (no module, no login, no type).
func TestFailedStageNamesTheKeyItCannotDestroy(t *testing.T) {
	ctx := t.Context()
	tok := &memToken{keys: map[string]ed25519.PrivateKey{}}
	k, cs, log := tokenKeeper(t, filepath.Join(t.TempDir(), "muster.db"), tok)
	who := Actor{Name: "spiffe://td/admin/ops"}
	if _, err := k.EnsureFirst(ctx, who); err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for _, ref := range refsOf(t, cs) {
		stored[string(ref)] = true
	}
	failing := NewKeeper(&applyFailing{Store: cs, err: store.ErrUnavailable, away: tok}, k.custody, log, "prod-a3f2e1", 0)
	_, err := failing.Stage(ctx, who, time.Hour, 24*time.Hour)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Stage = %v, want %v", err, store.ErrUnavailable)
	}
	var left []byte
	tok.mu.Lock()
	for ref := range tok.keys {
		if !stored[ref] {
			left = []byte(ref)
		}
	}
	tok.mu.Unlock()
	if left == nil {
		t.Fatal("no key left in the token: the test did not make destroying fail")
	}
	for _, want := range custody.DeleteCommands(memModule, left) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Stage = %v\nwant it to name %q", err, want)
		}
	}
}
