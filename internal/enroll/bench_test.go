package enroll

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
)

// BenchmarkPSKBootstrap measures a PSK join in the service (no RPC, no
// TLS) on a durable SQLite store, with parallel callers, with and without
// a referral ticket, against the pure crypto of the same join measured in
// the same run: the CSR's signature checked and the certificate signed,
// plus, with a ticket, its Ed25519 signature checked. CSRs and tickets
// are made by agents and discovery, so they are prepared before the clock
// starts.
func BenchmarkPSKBootstrap(b *testing.B) {
	for _, withTicket := range []bool{false, true} {
		name := "psk"
		if withTicket {
			name = "psk+ticket"
		}
		b.Run(name, func(b *testing.B) {
			e := newTicketEnv(b)
			key, _ := e.active(b)
			if !withTicket {
				e.svc.cfg.Tickets = nil
			}
			type join struct {
				csr    []byte
				ticket string
			}
			joins := make([]join, b.N)
			for i := range joins {
				node := fmt.Sprintf("node-%d", i)
				joins[i].csr = nodeCSR(b, node)
				if withTicket {
					joins[i].ticket, _ = e.ticket(b, node, time.Now())
				}
			}
			bound := pskCryptoBound(b, e, joins[0].csr, withTicket)
			var next atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					j := joins[next.Add(1)-1]
					if _, err := e.svc.BootstrapWithPSK(context.Background(), Request{}, key.Reveal(), j.ticket, j.csr); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(bound, "crypto-ns/op")
			b.ReportMetric(bound/perOp, "of-crypto-bound")
		})
	}
}

// pskCryptoBound times the crypto of one join alone.
func pskCryptoBound(b *testing.B, e *ticketEnv, csrDER []byte, withTicket bool) float64 {
	id, _ := url.Parse("spiffe://td/agent/node-0")
	tok, _ := e.ticket(b, "node-0", time.Now())
	pub := e.key.Public().(ed25519.PublicKey)
	const n = 300
	start := time.Now()
	for range n {
		csr, err := ca.ParseCSR(csrDER)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: csr.PublicKey, SPIFFEID: id,
			CommonName: "node-0", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
		if withTicket {
			if !verifyEd25519(pub, tok) {
				b.Fatal("ticket signature")
			}
		}
	}
	return float64(time.Since(start).Nanoseconds()) / n
}

// verifyEd25519 checks a compact JWS's signature and nothing else: the
// floor under referral.Verifier.
func verifyEd25519(pub ed25519.PublicKey, jws string) bool {
	i := strings.LastIndexByte(jws, '.')
	if i < 0 {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(jws[i+1:])
	return err == nil && ed25519.Verify(pub, []byte(jws[:i]), sig)
}
