package authority

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/task"
)

// signersOnly is a store that answers ListSigners alone.
type signersOnly struct {
	store.Store
	signers []store.Signer
}

func (s signersOnly) ListSigners(context.Context) ([]store.Signer, store.SignerSetID, error) {
	return s.signers, store.SignerSetID{}, nil
}

// A task refused as signed by an unknown signer that the store holds as
// active, staged, or in grace (before grace_until) is refused by an agent
// that does not hold the authority's verifier set: the audit names the
// refresh and the join, for a rotate task too, which otherwise needs
// nothing. Past grace_until (the store not yet caught up) or retired, the
// agent is right and the rotate task needs nothing.
func TestRefusalWayOutForSignersTheSetVouchesFor(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	s := &Server{store: signersOnly{signers: []store.Signer{
		{VersionID: "s1", State: store.SignerGrace, GraceUntil: now.Add(time.Hour)},
		{VersionID: "s0", State: store.SignerGrace, GraceUntil: now.Add(-time.Minute)},
		{VersionID: "s2", State: store.SignerActive},
		{VersionID: "s3", State: store.SignerStaged},
		{VersionID: "r1", State: store.SignerRetired},
	}}}
	s.cfg.Clock = func() time.Time { return now }
	refresh := "`muster agent trust refresh --data ADIR`"
	for _, c := range []struct {
		signer, taskType, want string
	}{
		{"s1", task.TypeRotateSigningKey, refresh},
		{"s1", "app.restart", refresh},
		{"s2", task.TypeRotateSigningKey, refresh},
		{"s3", task.TypeRotateSigningKey, refresh},
		{"s0", task.TypeRotateSigningKey, "nothing to do"},
		{"r1", task.TypeRotateSigningKey, "nothing to do"},
		{"r1", "app.restart", "signed by the active signer"},
	} {
		current := s.currentSignerState(t.Context(), c.signer)
		way := refusalWayOut(task.ReasonUnknownSigner, c.taskType, "n1", current)
		if !strings.Contains(way, c.want) {
			t.Errorf("%s task signed by %s (store: %q): %q, want %q", c.taskType, c.signer, current, way, c.want)
		}
		if c.want == refresh && !strings.Contains(way, "muster agent join --force --data ADIR --node n1") {
			t.Errorf("%s task signed by %s: %q names no join", c.taskType, c.signer, way)
		}
	}
}
