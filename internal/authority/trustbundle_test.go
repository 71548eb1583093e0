package authority

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	"github.com/muster-dev/muster/internal/trustbundle"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestTrustBundleInAnswersAndStreams: the join answer carries the root and
// the four intermediates; the stream sends the bundle as it opens, and
// again within seconds of a successor being prepared; the renewal answer
// carries the new one; a heartbeat reporting it makes ca status count the
// agent as holding the prepared intermediate.
func TestTrustBundleInAnswersAndStreams(t *testing.T) { testTrustBundle(t, startBench(t)) }

// TestTrustBundleTwoReplicasPostgres: prepared through one replica, pushed
// on a stream open on the other (its change notifications).
func TestTrustBundleTwoReplicasPostgres(t *testing.T) {
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	if benchPGErr != nil {
		t.Fatalf("PostgreSQL: %v", benchPGErr)
	}
	url := benchPG.NewDatabase(t)
	testTrustBundle(t, startReplicas(t, func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }, 2))
}

func parseBundle(t *testing.T, pb *musterv1.TrustBundle) trustbundle.Set {
	t.Helper()
	s, err := trustbundle.ParseDER(pb.GetAuthorityId(), pb.GetRoots(), pb.GetIntermediates(), pb.GetCrossCertificates())
	if err != nil {
		t.Fatal(err)
	}
	if s.Digest() != pb.GetDigest() {
		t.Fatalf("bundle digest %s, its content's %s", pb.GetDigest(), s.Digest())
	}
	return s
}

func testTrustBundle(t *testing.T, a *benchAuthority) {
	ctx := t.Context()
	last := len(a.srvs) - 1
	key, csr := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conns[last]).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: a.token, NodeId: "holder", Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	joined := parseBundle(t, resp.GetTrustBundle())
	if len(joined.Roots) != 1 || !joined.Roots[0].Equal(a.h.Root) || len(joined.Intermediates) != 4 || joined.AuthorityID != a.info.AuthorityID {
		t.Fatalf("join answer's bundle: %d roots, %d intermediates, authority %q", len(joined.Roots), len(joined.Intermediates), joined.AuthorityID)
	}
	chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	conn, err := grpc.NewClient(a.conns[last].Target(), grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, a.h.RootPool(), identity.MatchID(want)))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := musterv1.NewAgentServiceClient(conn).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	bundles := make(chan *musterv1.TrustBundle, 8)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				close(bundles)
				return
			}
			if b := m.GetTrustBundle(); b != nil {
				bundles <- b
			}
		}
	}()
	next := func(what string) trustbundle.Set {
		t.Helper()
		select {
		case b, ok := <-bundles:
			if !ok {
				t.Fatalf("stream ended waiting for %s", what)
			}
			return parseBundle(t, b)
		case <-time.After(10 * time.Second):
			t.Fatalf("no trust bundle within 10 s: %s", what)
		}
		return trustbundle.Set{}
	}
	if got := next("at open"); got.Digest() != joined.Digest() {
		t.Fatal("the stream opened with another bundle than the join's")
	}

	row, err := a.srvs[0].inter.prepare(ctx, ca.RoleAgent, a.h.RootKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pushed := next("after a successor was prepared")
	prepared := mustParse(t, row.CertDER)
	has := false
	for _, c := range pushed.Intermediates {
		has = has || c.Equal(prepared)
	}
	if len(pushed.Intermediates) != 5 || !has {
		t.Fatalf("pushed bundle holds %d intermediates, want the 4 and the prepared one", len(pushed.Intermediates))
	}
	select {
	case b := <-bundles:
		t.Fatalf("a second bundle sent for one change: %s", b.GetDigest())
	case <-time.After(300 * time.Millisecond):
	}
	_, csr2 := benchCSR(t)
	r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: csr2})
	if err != nil {
		t.Fatal(err)
	}
	if got := parseBundle(t, r.GetTrustBundle()); got.Digest() != pushed.Digest() {
		t.Fatal("the renewal answer carries another bundle than the one pushed")
	}

	// The agent reports what it holds; ca status counts it (through any
	// replica: the heartbeat is in the store).
	if err := stream.Send(&musterv1.AgentMessage{Body: &musterv1.AgentMessage_Heartbeat{Heartbeat: &musterv1.Heartbeat{
		TrustBundleDigest: pushed.Digest(), TrustBundleCerts: pushed.Fingerprints()}}}); err != nil {
		t.Fatal(err)
	}
	preparedFP := trustbundle.CertFingerprint(prepared)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := a.srvs[0].caStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]string{}
		ok := st.GetConnectedAgents() == 1 && st.GetRootKeyOnline() && st.GetBundleDigest() == pushed.Digest()
		for _, c := range st.GetCertificates() {
			counts[c.GetFingerprint()] = fmt.Sprintf("%s/%s/%s:%d", c.GetKind(), c.GetRole(), c.GetState(), c.GetAgentsHolding())
			ok = ok && c.GetAgentsHolding() == 1
			if want := map[string]string{"root": "file", "intermediate": "sealed"}[c.GetKind()]; c.GetKeyCustody() != want {
				t.Fatalf("%s %s %s: key custody %q, want %q", c.GetKind(), c.GetRole(), c.GetSerial(), c.GetKeyCustody(), want)
			}
		}
		if ok && counts[preparedFP] == "intermediate/agent/prepared:1" && len(counts) == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ca status: connected %d, root key %v, digest %s, certificates %v", st.GetConnectedAgents(), st.GetRootKeyOnline(), st.GetBundleDigest(), counts)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCAStatusWarnsWithoutTheRootKey: with the root key offline, ca status
// says so and warns of every active intermediate whose half-life is within
// 60 days (all four under a 2-minute lifetime), and of none under a year's.
func TestCAStatusWarnsWithoutTheRootKey(t *testing.T) {
	a := startBench(t)
	ctx := t.Context()
	for _, tc := range []struct {
		ttl  time.Duration
		want int
	}{{2 * time.Minute, 4}, {365 * 24 * time.Hour, 0}} {
		s := &Server{store: a.store, ca: &ca.Hierarchy{Root: a.h.Root, Issuers: a.h.Issuers}, cfg: Config{CAIntermediateTTL: tc.ttl},
			info: a.info, hub: newStreamHub(), log: a.srvs[0].log}
		st, err := s.caStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetRootKeyOnline() || len(st.GetWarnings()) != tc.want {
			t.Fatalf("ttl %s: root key online %v, warnings %q; want offline and %d", tc.ttl, st.GetRootKeyOnline(), st.GetWarnings(), tc.want)
		}
		if c := st.GetCertificates()[0]; c.GetKind() != "root" || c.GetKeyCustody() != "offline" {
			t.Fatalf("root without its key: %s key custody %q, want offline", c.GetKind(), c.GetKeyCustody())
		}
		for _, w := range st.GetWarnings() {
			if !strings.Contains(w, "root key is not in the data directory") || !strings.Contains(w, "muster ca rotate") {
				t.Errorf("warning does not say what to do: %s", w)
			}
		}
	}
	if st, err := a.srvs[0].caStatus(ctx); err != nil || !st.GetRootKeyOnline() || len(st.GetWarnings()) != 0 {
		t.Fatalf("with the root key: %v, %v", st, err)
	}
}
