package authority

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

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
