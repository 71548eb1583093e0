package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/benchbound"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/loadgen"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkRenewalKept: a renewal whose handshake is done, as muster bench
// --connection kept measures it against a running authority. One agent
// renews generation after generation; before each renewal, with the timer
// stopped, a connection presenting its newest certificate is opened and
// readied with a health check (the handshake, the connection's class and
// its client-chain check, a first call); only the renewal call is timed,
// and counted in allocs/op (both ends are in this process, so the client's
// side of the call is in it too). Its bound is the CSR check and the
// certificate (loadgen.ServerPrimitives without a new connection).
func BenchmarkRenewalKept(b *testing.B) {
	a := startBench(b)
	ctx := context.Background()
	tb, err := loadgen.MeasureBound(loadgen.OpRenew, false)
	if err != nil {
		b.Fatal(err)
	}
	type keyCSR struct {
		key *ecdsa.PrivateKey
		csr []byte
	}
	pool := make([]keyCSR, 16)
	for i := range pool {
		pool[i].key, pool[i].csr = benchCSR(b)
	}
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx,
		&musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: "kept-renewal", Csr: pool[0].csr})
	if err != nil {
		b.Fatal(err)
	}
	chainPEM, key := resp.GetCertificateChainPem(), pool[0].key
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		chain, err := ca.ParseCertsPEM([]byte(chainPEM))
		if err != nil {
			b.Fatal(err)
		}
		conn := a.dial(&identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}})
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
		next := pool[(i+1)%len(pool)]
		b.StartTimer()
		r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: next.csr})
		b.StopTimer()
		conn.Close()
		if err != nil {
			b.Fatal(err)
		}
		chainPEM, key = r.GetCertificateChainPem(), next.key
		b.StartTimer()
	}
	b.StopTimer()
	// No cpu_efficiency: the process's CPU holds the untimed handshakes
	// too (muster bench --connection kept measures it on the authority).
	benchbound.Report(b, tb.PerOp, 0)
}
