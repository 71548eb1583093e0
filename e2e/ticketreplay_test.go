package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/discoveryclient"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestReferralTicketSpentOnceAcrossReplicas: one referral ticket sent to
// two authority replicas on one PostgreSQL database admits one join.
// Sent to both at once, with two keys, one join succeeds and the other is
// refused (node taken, or ticket used: whichever write it meets first);
// and once its node is deleted, so that only the ticket's use stands in
// the way, the ticket replayed to the other replica is refused "already
// used": its single use is one conditional write in the store both share.
func TestReferralTicketSpentOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := postgres(t)
	dir, init := initDir(t, "--store", url)
	d := startDiscovery(t, filepath.Join(t.TempDir(), "discovery"), allowing(init)...)
	args := []string{"--store", url, "--discovery", d.addr, "--discovery-fingerprint", d.fingerprint}
	bdir := replicaDir(t, dir)
	replicas := []*joinEnv{{dir: dir, auth: startAuthority(t, dir, args...)}, {dir: bdir, auth: startAuthority(t, bdir, args...)}}
	e := &referralEnv{disc: d, dir: dir, auth: replicas[0].auth, authorityID: init["authority_id"].(string),
		fingerprint: init["ca_fingerprint"].(string), psk: init["bootstrap_psk"].(string)}
	e.waitRegistered(t)
	var certs []musterv1.CertificateServiceClient
	for _, r := range replicas {
		r.setup(t)
		certs = append(certs, musterv1.NewCertificateServiceClient(r.dial(t, nil)))
	}
	conn, err := discoveryclient.Dial(d.addr, d.fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ticket := func(node string) string {
		t.Helper()
		r, err := musterv1.NewDiscoveryServiceClient(conn).RequestReferralTicket(context.Background(),
			&musterv1.RequestReferralTicketRequest{AuthorityId: e.authorityID, NodeId: node})
		if err != nil {
			t.Fatalf("ticket for %s: %v", node, err)
		}
		return r.GetTicket()
	}
	join := func(i int, node, tk string) error {
		_, csr := csrFor(t, node)
		_, err := certs[i].RequestCertificate(context.Background(), &musterv1.RequestCertificateRequest{
			Csr: csr, BootstrapPsk: e.psk, ReferralTicket: tk})
		return err
	}

	// At once, on both replicas.
	tk := ticket("race-1")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range certs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = join(i, "race-1", tk) }()
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case status.Code(err) == codes.AlreadyExists,
			status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "referral ticket was already used"):
			refused++
		}
	}
	if ok != 1 || refused != 1 {
		t.Fatalf("one ticket at two replicas at once: %v, want one join and one refusal", errs)
	}

	// In turn, with the node deleted between: only the ticket's use is left.
	tk = ticket("spent-1")
	if err := join(0, "spent-1", tk); err != nil {
		t.Fatalf("join on replica 1: %v", err)
	}
	mustRun(t, "agents", "delete", "spent-1", "--data", dir, "--authority", replicas[0].auth.addr)
	err = join(1, "spent-1", tk)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "referral ticket was already used") {
		t.Fatalf("the ticket replayed to replica 2 after the node was deleted: %v, want PERMISSION_DENIED already used", err)
	}
	if a := mustRun(t, "audit", "list", "--data", dir, "--authority", replicas[1].auth.addr, "--action", "agent.join"); !strings.Contains(a, "referral ticket was already used") {
		t.Errorf("the replay's refusal is not audited:\n%s", a)
	}
}
