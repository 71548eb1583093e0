package enroll

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/benchbound"
	"github.com/muster-dev/muster/internal/loadgen"
)

// BenchmarkPSKBootstrap measures a PSK join in the service (no RPC, no
// TLS) on a durable SQLite store, with parallel callers, with and without
// a referral ticket, against the server-side bound of the same join
// measured in the same run: muster bench's PSK join on a kept connection
// (loadgen.MeasureBound: the PSK's check, the CSR's signature checked and
// the certificate signed), plus, with a ticket, its Ed25519 signature
// checked, timed the same way (loadgen.TimeCrypto). It reports them as
// the authority package's in-process benchmarks do (benchbound.Report). CSRs
// and tickets are made by agents and discovery, so they are prepared
// before the clock starts.
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
			bound := pskBound(b, e, withTicket)
			var next atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			cpu0 := loadgen.ProcessCPU()
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
			// No RPC or TLS here: the process is the service, its store and
			// the callers' loop.
			benchbound.Report(b, bound, cpu0)
		})
	}
}

// pskBound is the server-side bound of one PSK join on a kept connection,
// with the ticket's signature check when a ticket comes with it.
func pskBound(b *testing.B, e *ticketEnv, withTicket bool) time.Duration {
	bound, err := loadgen.MeasureBound(loadgen.OpPSKJoin, false)
	if err != nil {
		b.Fatal(err)
	}
	if !withTicket {
		return bound.PerOp
	}
	tok, _ := e.ticket(b, "node-0", time.Now())
	pub := e.key.Public().(ed25519.PublicKey)
	ticket, err := loadgen.TimeCrypto(func() error {
		if !verifyEd25519(pub, tok) {
			return fmt.Errorf("the ticket's signature does not verify")
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return bound.PerOp + ticket
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
