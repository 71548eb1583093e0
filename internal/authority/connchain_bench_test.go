package authority

import (
	"context"
	"crypto/x509"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkKeptConnection: one agent's calls, one after another, over one
// mTLS connection it keeps (as an agent does between its stream's tasks):
// GetVerifierSet (the authorization, the agent's standing read from the
// store, the answer) and a health check (the authorization alone, whose
// client-certificate check is the work that varies).
func BenchmarkKeptConnection(b *testing.B) {
	a := startBench(b)
	ctx := context.Background()
	key, csr := benchCSR(b)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx,
		&musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: "kept", Csr: csr})
	if err != nil {
		b.Fatal(err)
	}
	chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	conn := a.dial(&identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}})
	agent := musterv1.NewAgentServiceClient(conn)
	health := healthpb.NewHealthClient(conn)
	b.Run("GetVerifierSet", func(b *testing.B) {
		for b.Loop() {
			if _, err := agent.GetVerifierSet(ctx, &musterv1.GetVerifierSetRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Health", func(b *testing.B) {
		for b.Loop() {
			if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
