package authority

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestHeartbeatOfADeletedNode: agents delete removes the node's stream
// row with the node, so the stream's heartbeat that comes before its
// standing closes it (within a second) finds no row. That is the
// deletion, not a store failure: not logged as "cannot record a
// heartbeat", and the row is not written back.
func TestHeartbeatOfADeletedNode(t *testing.T) {
	ctx := t.Context()
	st := openSQLite(t)
	var logs bytes.Buffer
	s := &Server{store: st, log: slog.New(slog.NewTextHandler(&logs, nil))}
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CommitJoin(ctx, store.Join{NodeID: "n1",
		Instance: store.Instance{ID: "inst-1", JoinMethod: store.JoinMethodPSK, CreatedAt: now, LastSerial: "0a",
			LastPublicKey: []byte{1}, LastChainPEM: []byte("chain"), LastIssuedAt: now},
		Certificate: store.Certificate{Serial: "0a", NodeID: "n1", InstanceID: "inst-1", JoinMethod: store.JoinMethodPSK,
			PublicKey: []byte{1}, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
		t.Fatal(err)
	}
	row := store.AgentStream{NodeID: "n1", StreamID: "s1", Replica: "r:7443", Connected: true, ConnectedAt: now, LastSeen: now}
	if err := st.RecordAgentStream(ctx, row); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteNode(ctx, "n1", setupLink); err != nil {
		t.Fatal(err)
	}
	err = s.recordHeartbeat(ctx, row, &musterv1.Heartbeat{VerifierSetVersion: 1})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("heartbeat after the node's deletion = %v; want its row not found", err)
	}
	if strings.Contains(logs.String(), "cannot record a heartbeat") {
		t.Errorf("the heartbeat of a deleted node's stream was logged as a failure:\n%s", logs.String())
	}
	if _, err := st.GetAgentStream(ctx, "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the deleted node's stream row after its heartbeat: %v; want none", err)
	}
}
