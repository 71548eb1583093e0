package authority

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestStreamLive: a stream row counts as connected only while its replica
// records heartbeats. A row marked connected whose last heartbeat is
// older than streamStaleAfter is the stream of a replica that was killed
// (walked: SIGKILL of the replica an agent streamed to left its row
// "connected via" it for good).
func TestStreamLive(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		row  *store.AgentStream
		want bool
	}{
		{"never connected", nil, false},
		{"closed", &store.AgentStream{ConnectedAt: now.Add(-time.Minute), LastSeen: now}, false},
		{"heartbeat now", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now}, true},
		{"heartbeat 30 s ago", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now.Add(-30 * time.Second)}, true},
		{"heartbeat at the limit", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now.Add(-streamStaleAfter)}, true},
		{"opened now, no heartbeat yet", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Second)}, true},
		{"replica killed", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour), LastSeen: now.Add(-streamStaleAfter - time.Second)}, false},
		{"replica killed before a heartbeat", &store.AgentStream{Connected: true, ConnectedAt: now.Add(-time.Hour)}, false},
	} {
		if got := streamLive(tt.row, now); got != tt.want {
			t.Errorf("%s: streamLive = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestStaleStreamRowIsNotConnected: agents list and show say a stream
// whose replica left its row marked connected with no heartbeat for over
// streamStaleAfter is not connected, and stale; ca status counts neither
// it among the connected agents nor its report among the agents holding
// a certificate. Before, a replica killed left its agents "connected via"
// it and counted, for good.
func TestStaleStreamRowIsNotConnected(t *testing.T) { testStaleStreamRow(t, startBench(t)) }

// TestStaleStreamRowIsNotConnectedPostgres: the same on two replicas
// sharing a PostgreSQL, read through the second, by the database's clock.
func TestStaleStreamRowIsNotConnectedPostgres(t *testing.T) {
	t.Parallel()
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	pgtest.FailOrSkip(t, benchPGErr)
	url := benchPG.NewDatabase(t)
	testStaleStreamRow(t, startReplicas(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, 2))
}

func testStaleStreamRow(t *testing.T, b *benchAuthority) {
	ctx := t.Context()
	st := b.store
	now, err := st.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	root := trustbundle.CertFingerprint(b.h.Root)
	report, _ := json.Marshal(heartbeatJSON{TrustBundleCerts: []string{root}})
	for i, n := range []struct {
		id       string
		lastSeen time.Time
	}{{"live", now}, {"gone", now.Add(-streamStaleAfter - time.Minute)}} {
		inst, serial := "inst-"+n.id, []string{"0a", "0b"}[i]
		if _, err := st.CommitJoin(ctx, store.Join{NodeID: n.id,
			Instance: store.Instance{ID: inst, JoinMethod: store.JoinMethodPSK, CreatedAt: now, LastSerial: serial,
				LastPublicKey: []byte{byte(i)}, LastChainPEM: []byte("chain"), LastIssuedAt: now},
			Certificate: store.Certificate{Serial: serial, NodeID: n.id, InstanceID: inst, JoinMethod: store.JoinMethodPSK,
				PublicKey: []byte{byte(i)}, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
			t.Fatal(err)
		}
		if err := st.RecordAgentStream(ctx, store.AgentStream{NodeID: n.id, StreamID: "s-" + n.id, Replica: "r-" + n.id + ":7443", Connected: true,
			ConnectedAt: n.lastSeen.Add(-time.Hour), LastSeen: n.lastSeen, Report: string(report)}); err != nil {
			t.Fatal(err)
		}
	}
	srv := b.srvs[len(b.srvs)-1]
	a := &adminService{s: srv}

	list, err := a.listAgents(ctx, &musterv1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	streams := map[string]*musterv1.AgentStreamStatus{}
	for _, g := range list.GetAgents() {
		streams[g.GetNodeId()] = g.GetStream()
	}
	if s := streams["live"]; !s.GetConnected() || s.GetStale() {
		t.Errorf("agents list, live: connected %v, stale %v; want connected", s.GetConnected(), s.GetStale())
	}
	show, err := a.getAgent(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	for what, s := range map[string]*musterv1.AgentStreamStatus{"list": streams["gone"], "show": show.GetAgent().GetStream()} {
		if s.GetConnected() || !s.GetStale() || s.GetReplica() != "r-gone:7443" {
			t.Errorf("agents %s, gone: connected %v, stale %v, replica %q; want not connected, stale, on r-gone:7443", what, s.GetConnected(), s.GetStale(), s.GetReplica())
		}
	}

	status, err := srv.caStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.GetConnectedAgents() != 1 {
		t.Errorf("ca status: %d connected agents, want 1 (the live stream)", status.GetConnectedAgents())
	}
	held := int64(-1)
	for _, c := range status.GetCertificates() {
		if c.GetFingerprint() == root {
			held = c.GetAgentsHolding()
		}
	}
	if held != 1 {
		t.Errorf("ca status: the root held by %d agents (-1: not listed), want 1 (the live stream's report)", held)
	}
}
