package authority

import (
	"context"
	"crypto/x509"
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkStreamOpen: one agent's stream opened over a kept connection
// (no handshake) until its first message arrives, each replacing the
// agent's stream before it: the standing check, the node's stream row
// read and written over the row read (record), the replacement, and the
// first send. "reconnect" is one holder opening again and again (an
// agent after a network blip); "two-holders" alternates two source hosts
// presenting one certificate (a cloned disk), so every open is a
// replacement between holders and the copy count is carried and, at
// every third alternation, audited.
func BenchmarkStreamOpen(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			var open func(ctx context.Context) (store.Store, error)
			if backend == "postgres" {
				benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
				if benchPGErr != nil {
					b.Skip(benchPGErr)
				}
				url := benchPG.NewDatabase(b)
				open = func(ctx context.Context) (store.Store, error) { return postgres.Open(ctx, url) }
			}
			a := startReplicas(b, open, 1)
			for _, holders := range []struct {
				name string
				n    int
			}{{"reconnect", 1}, {"two-holders", 2}} {
				b.Run(holders.name, func(b *testing.B) {
					benchStreamOpens(b, a, "open-"+holders.name, holders.n)
				})
			}
		})
	}
}

// benchStreamOpens joins node and opens its stream b.N times, from n
// source hosts in turn, each open timed until its first message.
func benchStreamOpens(b *testing.B, a *benchAuthority, node string, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key, csr := benchCSR(b)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: a.token, NodeId: node, Csr: csr})
	if err != nil {
		b.Fatal(err)
	}
	chain, err := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	if err != nil {
		b.Fatal(err)
	}
	id := &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	clients := make([]musterv1.AgentServiceClient, n)
	for i := range clients {
		conn := a.dialFrom(b, net.IPv4(127, 0, 9, byte(10+i)), id)
		clients[i] = musterv1.NewAgentServiceClient(conn)
	}
	openOne := func(c musterv1.AgentServiceClient) context.CancelFunc {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := c.Connect(sctx, grpc.WaitForReady(true))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			b.Fatal(err)
		}
		return scancel
	}
	// The connections' handshakes and a first row, untimed.
	var prev context.CancelFunc
	for _, c := range clients {
		if prev != nil {
			prev()
		}
		prev = openOne(c)
	}
	i := 0
	for b.Loop() {
		next := openOne(clients[i%n])
		prev()
		prev = next
		i++
	}
	prev()
}
