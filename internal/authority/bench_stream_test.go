package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkTaskFanOut: one task queued for 1,000 agents whose streams are
// open on an in-process authority (SQLite), timed until every stream has
// received it. The store announces the task to the 1,000 streams, each of
// which re-checks its standing and sends its pending tasks, so the figure
// is the time those checks take to get round.
func BenchmarkTaskFanOut(b *testing.B) {
	const agents = 1000
	a := startBench(b)
	boot := musterv1.NewBootstrapServiceClient(a.conn)
	keys := make([]keyCSRPair, 16)
	for i := range keys {
		keys[i].key, keys[i].csr = benchCSR(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu       sync.Mutex
		received = map[string]int{}
		cond     = sync.NewCond(&mu)
	)
	nodes := make([]string, agents)
	for i := range agents {
		nodes[i] = fmt.Sprintf("fan-%d", i)
		k := keys[i%len(keys)]
		resp, err := boot.ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: nodes[i], Csr: k.csr})
		if err != nil {
			b.Fatal(err)
		}
		chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
		conn := a.dialFrom(b, net.IPv4(127, 0, byte(i/200), 2), &identity.Identity{Chain: chain, Key: k.key, Roots: []*x509.Certificate{a.h.Root}})
		stream, err := musterv1.NewAgentServiceClient(conn).Connect(ctx)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				m, err := stream.Recv()
				if err != nil {
					return
				}
				if t := m.GetTask(); t != nil {
					env, _ := task.Decode(t)
					mu.Lock()
					received[env.TaskID]++
					cond.Broadcast()
					mu.Unlock()
				}
			}
		}()
	}
	srv := a.srvs[0]
	b.ResetTimer()
	for b.Loop() {
		env, _, _, err := srv.queueToAll(ctx, task.Envelope{TaskType: task.TypeReport, Target: task.Target{All: true}}, 10*time.Minute, audit.Event{Actor: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		for received[env.TaskID] < agents {
			cond.Wait()
		}
		mu.Unlock()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/fan-out")
}

type keyCSRPair struct {
	key *ecdsa.PrivateKey
	csr []byte
}

// dialFrom connects to the first replica from the loopback address src: a
// thousand agents on 127.0.0.1 alone would pass listener.MaxConnsPerSource.
func (a *benchAuthority) dialFrom(b testing.TB, src net.IP, id *identity.Identity) *grpc.ClientConn {
	want, _ := spiffeid.New(a.info.TrustDomain, spiffeid.RoleAuthority, a.info.AuthorityID)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
	conn, err := grpc.NewClient(*a.srvs[0].advertised.Load(),
		grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, a.h.RootPool(), identity.MatchID(want)))),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}
