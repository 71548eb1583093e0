package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
)

// TestStandbyIgnoresStaleStreamRow: next-phase to standby waits for an
// agent connected now under the old root, not for one whose stream row
// still says connected but had no heartbeat for over streamStaleAfter by
// the store clock (its replica was killed): the refusal counts and names
// only the live one. The check used to read row.Connected, so a killed
// replica's agents held standby back for good.
func TestStandbyIgnoresStaleStreamRow(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	now, err := a.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	leafAs := func(role spiffeid.Role, name string) *x509.Certificate {
		t.Helper()
		k, _ := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
		id, _ := spiffeid.New(a.info.TrustDomain, role, name)
		leaf, err := s.ca.Issuer(ca.Role(role)).Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: id.URL(), CommonName: name, ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	// Two agents under the old root, both with stream rows marked
	// connected: "live" heartbeated now, "gone" over streamStaleAfter ago.
	for i, n := range []struct {
		id       string
		lastSeen time.Time
	}{{"live", now}, {"gone", now.Add(-streamStaleAfter - time.Minute)}} {
		inst, serial := "inst-"+n.id, []string{"0a", "0b"}[i]
		if _, err := a.store.CommitJoin(ctx, store.Join{NodeID: n.id,
			Instance: store.Instance{ID: inst, JoinMethod: store.JoinMethodPSK, CreatedAt: now, LastSerial: serial,
				LastPublicKey: []byte{byte(i)}, LastChainPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafAs(spiffeid.RoleAgent, n.id).Raw}), LastIssuedAt: now},
			Certificate: store.Certificate{Serial: serial, NodeID: n.id, InstanceID: inst, JoinMethod: store.JoinMethodPSK,
				PublicKey: []byte{byte(i)}, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
			t.Fatal(err)
		}
		if err := a.store.RecordAgentStream(ctx, store.AgentStream{NodeID: n.id, StreamID: "s-" + n.id, Replica: "r-" + n.id + ":7443", Connected: true,
			ConnectedAt: n.lastSeen.Add(-time.Hour), LastSeen: n.lastSeen}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
	}
	// The operator renewed under the new root: only the agents stand in
	// the way.
	_, _, err = s.stepRoot(ctx, "t", rootNext, leafAs(spiffeid.RoleAdmin, "op"))
	if err == nil || !strings.Contains(err.Error(), "1 connected agent (live)") {
		t.Fatalf("standby with agent live under the old root and agent gone's stream stale: %v; want a refusal naming only live", err)
	}
}

// TestStandbyWaitsForAgentsAway: an agent seen before but away now (its
// stream row stale), whose certificate is still valid and under the old
// root, holds standby back with a refusal naming it and the override,
// and standby changes nothing; next-phase --leave-away (rootNextLeavingAway)
// goes on without it. Before, standby did not look at agents away, and
// each was refused its renewal when back, with nothing naming it before.
func TestStandbyWaitsForAgentsAway(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	now, err := a.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	leafAs := func(role spiffeid.Role, name string) *x509.Certificate {
		t.Helper()
		k, _ := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
		id, _ := spiffeid.New(a.info.TrustDomain, role, name)
		leaf, err := s.ca.Issuer(ca.Role(role)).Issue(ca.LeafRequest{PublicKey: k.Public(), SPIFFEID: id.URL(), CommonName: name, ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	lastSeen := now.Add(-streamStaleAfter - time.Minute)
	if _, err := a.store.CommitJoin(ctx, store.Join{NodeID: "away",
		Instance: store.Instance{ID: "inst-away", JoinMethod: store.JoinMethodPSK, CreatedAt: now, LastSerial: "0c",
			LastPublicKey: []byte{1}, LastChainPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafAs(spiffeid.RoleAgent, "away").Raw}), LastIssuedAt: now},
		Certificate: store.Certificate{Serial: "0c", NodeID: "away", InstanceID: "inst-away", JoinMethod: store.JoinMethodPSK,
			PublicKey: []byte{1}, NotBefore: now, NotAfter: now.Add(time.Hour), IssuedAt: now}}); err != nil {
		t.Fatal(err)
	}
	if err := a.store.RecordAgentStream(ctx, store.AgentStream{NodeID: "away", StreamID: "s-away", Replica: "r-away:7443", Connected: false,
		ConnectedAt: lastSeen.Add(-time.Hour), LastSeen: lastSeen}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, _, err := s.stepRoot(ctx, "t", rootNext); err != nil {
			t.Fatal(err)
		}
	}
	// ca status counts it among the agents away that have not reported
	// the new root.
	cs, err := s.caStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cs.GetAwayAgents() != 1 || !slices.ContainsFunc(cs.GetWarnings(), func(w string) bool {
		return strings.Contains(w, "0 of 0 connected agents and 1 of 1 agents away (seen before, certificate still valid) have not reported holding the new root")
	}) {
		t.Fatalf("ca status: %d agents away, warnings %q; want 1, and it counted as not holding the new root", cs.GetAwayAgents(), cs.GetWarnings())
	}
	op := leafAs(spiffeid.RoleAdmin, "op")
	_, _, err = s.stepRoot(ctx, "t", rootNext, op)
	if err == nil || !strings.Contains(err.Error(), "1 agent seen before but away now (away)") || !strings.Contains(err.Error(), "muster ca root next-phase --leave-away") ||
		!strings.Contains(err.Error(), "muster agents delete NODE") {
		t.Fatalf("standby with agent away under the old root: %v; want a refusal naming it, muster agents delete NODE and --leave-away", err)
	}
	if row, err := a.store.GetRootRotation(ctx); err != nil || row.Phase != store.RootPhaseUpdateServers {
		t.Fatalf("after a refused standby the rotation is in %q (%v), want update_servers", row.Phase, err)
	}
	if _, st, err := s.stepRoot(ctx, "t", rootNextLeavingAway, op); err != nil || st.Phase != store.RootPhaseStandby {
		t.Fatalf("standby --leave-away: %v (phase %q), want standby", err, st.Phase)
	}
	// The agents it left behind are in the step's record: nothing else
	// says later why they are refused their renewal.
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{Action: "ca.root_phase"})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(recs, func(r store.AuditRecord) bool { return r.Target == "update_servers->standby" })
	if i < 0 || recs[i].Result != audit.ResultOK || !strings.Contains(recs[i].Reason, "--leave-away: 1 agent away under the old root left behind (away)") {
		t.Fatalf("ca.root_phase records %+v; want update_servers->standby with the agent left away in its reason", recs)
	}
}

// TestLeaveAwayOnlyAtStandby: next-phase --leave-away on a step that does
// not go to standby is refused as a bad request and changes nothing.
// Before, it was accepted (and the CLI warned) and silently ignored, so a
// script keeping the flag would skip the wait at standby unawares.
func TestLeaveAwayOnlyAtStandby(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	if _, err := s.rotateRoot(ctx, "t", nil); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.stepRoot(ctx, "t", rootNextLeavingAway)
	var bad invalidArgument
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), "--leave-away applies only to the step to standby") ||
		!strings.Contains(err.Error(), "muster ca root next-phase --from "+store.RootPhaseInit) {
		t.Fatalf("--leave-away from %s: %v; want an invalid argument naming the command without the flag", store.RootPhaseInit, err)
	}
	if row, err := a.store.GetRootRotation(ctx); err != nil || row.Phase != store.RootPhaseInit {
		t.Fatalf("after a refused --leave-away the rotation is in %q (%v), want %s", row.Phase, err, store.RootPhaseInit)
	}
}
