package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"sync/atomic"
	"testing"

	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkPSKJoin: PSK joins (RequestCertificate with the bootstrap PSK,
// no client certificate) through gRPC over loopback TLS by parallel
// clients sharing their connections, as BenchmarkExchangeJoinToken does
// for token joins. A PSK join's node ID is its CSR's common name, so each
// join has a CSR of its own, all made before the clock starts.
func BenchmarkPSKJoin(b *testing.B) {
	a := startBench(b)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csrs := make([][]byte, b.N)
	for i := range csrs {
		der, err := x509.CreateCertificateRequest(rand.Reader,
			&x509.CertificateRequest{Subject: pkix.Name{CommonName: fmt.Sprintf("psk-node-%d", i)}}, key)
		if err != nil {
			b.Fatal(err)
		}
		csrs[i] = der
	}
	var clients []musterv1.CertificateServiceClient
	for _, c := range a.conns {
		clients = append(clients, musterv1.NewCertificateServiceClient(c))
	}
	var n atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1) - 1
			if _, err := clients[i%int64(len(clients))].RequestCertificate(context.Background(),
				&musterv1.RequestCertificateRequest{Csr: csrs[i], BootstrapPsk: a.psk}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
