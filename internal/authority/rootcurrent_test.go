package authority

import (
	"testing"

	"github.com/muster-dev/muster/internal/ca"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestStatusAndJoinAnswersFollowTheRootRotation: muster status's
// ca_fingerprint and a join answer's ca_certificate_pem are the roots the
// authority uses now, not the data directory's: before a rotation the
// root init made; in update_servers the new root's fingerprint (the one
// joining URIs pin) and both trusted roots, the new one first.
func TestStatusAndJoinAnswersFollowTheRootRotation(t *testing.T) {
	t.Parallel()
	a := startReplicas(t, nil, 1, fastCAClock)
	s := a.srvs[0]
	ctx := t.Context()
	admin := &adminService{s: s}
	oldFP := ca.Fingerprint(a.h.Root)
	join := func(node string) []string {
		t.Helper()
		_, csr := benchCSR(t)
		resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
			JoinToken: a.token, NodeId: node, Csr: csr})
		if err != nil {
			t.Fatal(err)
		}
		roots, err := ca.ParseCertsPEM([]byte(resp.GetCaCertificatePem()))
		if err != nil {
			t.Fatal(err)
		}
		var fps []string
		for _, r := range roots {
			fps = append(fps, ca.Fingerprint(r))
		}
		return fps
	}
	status := func() string {
		t.Helper()
		st, err := admin.GetStatus(ctx, &musterv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetCaFingerprint()
	}
	if got := status(); got != oldFP {
		t.Fatalf("status before a rotation: ca_fingerprint %s, want init's root %s", got, oldFP)
	}
	if got := join("before"); len(got) != 1 || got[0] != oldFP {
		t.Fatalf("a join before a rotation answered the roots %v, want %s", got, oldFP)
	}
	st, err := s.rotateRoot(ctx, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	newFP := ca.Fingerprint(st.New)
	for range 2 {
		if _, _, err := s.stepRoot(ctx, "test", rootNext); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := s.caStep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.inter.load(ctx); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != newFP {
		t.Fatalf("status in update_servers: ca_fingerprint %s, want the new root %s (old %s)", got, newFP, oldFP)
	}
	if got := join("during"); len(got) != 2 || got[0] != newFP || got[1] != oldFP {
		t.Fatalf("a join in update_servers answered the roots %v, want the new %s then the old %s", got, newFP, oldFP)
	}
}
