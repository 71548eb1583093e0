package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/task"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// BenchmarkTaskFanOut: one task queued for 1,000 agents whose streams are
// open on an in-process authority (SQLite), timed until every stream has
// received it. Delivery rides on each stream's store check
// (streamCheckEvery), so the figure is that period plus the time the
// checks of 1,000 streams take to get round.
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
		conn := a.dial(&identity.Identity{Chain: chain, Key: k.key, Roots: []*x509.Certificate{a.h.Root}})
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
		env, err := srv.queueTask(ctx, task.Envelope{TaskType: task.TypeReport, Target: task.Target{All: true}}, nodes, 10*time.Minute, "bench")
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
