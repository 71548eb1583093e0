package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/jointoken"
	"github.com/muster-dev/muster/internal/loadgen"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/spiffeid"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// benchAuthority runs real authorities in-process on loopback TLS, one or
// several replicas on one store, and returns connections that pin the root
// like an agent.
type benchAuthority struct {
	srvs  []*Server
	conn  *grpc.ClientConn   // to the first replica
	conns []*grpc.ClientConn // one per replica
	h     *ca.Hierarchy
	td    string
	token string
	dial  func(id *identity.Identity) *grpc.ClientConn
	// store and sk are the first replica's, to set up what a test needs.
	store store.Store
	sk    seal.StorageKey
	info  datadir.Info
	psk   string // the bootstrap PSK init made
}

func startBench(b testing.TB) *benchAuthority {
	return startReplicas(b, nil, 1)
}

// startReplicasWith is startReplicas with set, if not nil, changing each
// replica's configuration before it starts.
func startReplicasWith(b testing.TB, open func(ctx context.Context) (store.Store, error), n int, set func(*Config)) *benchAuthority {
	b.Helper()
	if set == nil {
		return startReplicas(b, open, n)
	}
	return startReplicas(b, open, n, set)
}

// startReplicas initialises an authority on the store open returns (nil:
// the embedded SQLite file, durable writes) and runs n replicas of it.
// Each option changes every replica's Config before it is built.
func startReplicas(b testing.TB, open func(ctx context.Context) (store.Store, error), n int, opts ...func(*Config)) *benchAuthority {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	res, err := datadir.Init(ctx, datadir.InitOptions{Dir: datadir.Dir(filepath.Join(b.TempDir(), "a")), Name: "bench",
		Now: time.Now(), OpenStore: open})
	if err != nil {
		b.Fatal(err)
	}
	dir := res.Dir
	if open == nil {
		open = func(ctx context.Context) (store.Store, error) { return sqlite.Open(ctx, dir.DatabaseFile()) }
	}
	// Each replica loads its own hierarchy, as separate processes do, so
	// that what one reads from the store is not seen by another through
	// shared memory.
	var h *ca.Hierarchy
	sk, err := seal.LoadStorageKey(dir.StorageKeyFile())
	if err != nil {
		b.Fatal(err)
	}
	var first store.Store
	var addrs []string
	var srvs []*Server
	for range n {
		st, err := open(ctx)
		if err != nil {
			b.Fatal(err)
		}
		hr, err := ca.Load(dir.CADir())
		if err != nil {
			b.Fatal(err)
		}
		if first == nil {
			first, h = st, hr
		}
		m := NewMetrics("bench")
		logger, err := datadir.NewAuditLogger(st, sk, dir.CheckpointFile(), m.OnAudit)
		if err != nil {
			b.Fatal(err)
		}
		ready := make(chan string, 1)
		cfg := Config{Dir: dir, Info: res.Info, CA: hr, Store: st, Audit: logger, StorageKey: sk,
			Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready: func(addr, _ string) { ready <- addr }}
		for _, o := range opts {
			o(&cfg)
		}
		srv, err := New(cfg, m)
		if err != nil {
			b.Fatal(err)
		}
		// Joins from one source would hit the bootstrap rate limit.
		srv.limiter.SetDefault(1e9, 1e9)
		done := make(chan error, 1)
		rctx, rcancel := context.WithCancel(ctx)
		go func() { done <- srv.Run(rctx) }()
		addrs = append(addrs, <-ready)
		srvs = append(srvs, srv)
		b.Cleanup(func() { rcancel(); <-done; st.Close() })
	}

	// An unlimited, never-expiring token.
	tok, _ := jointoken.Generate()
	sealer, _ := sk.Sealer(seal.InfoToken)
	ct, nonce, _ := sealer.Seal(tok.Secret(), []byte(tok.ID))
	if err := first.InsertToken(ctx, store.Token{ID: tok.ID, JoinMethod: store.JoinMethodToken, Ciphertext: ct, Nonce: nonce,
		CreatedBy: "bench", CreatedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	want, _ := spiffeid.New(res.Info.TrustDomain, spiffeid.RoleAuthority, res.Info.AuthorityID)
	var next atomic.Int64
	dialAt := func(addr string, id *identity.Identity) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, h.RootPool(), identity.MatchID(want)))))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		return conn
	}
	a := &benchAuthority{srvs: srvs, h: h, td: res.Info.TrustDomain, token: tok.Reveal(), store: first, sk: sk, info: res.Info,
		psk: res.BootstrapPSK.Reveal(),
		// Renewals go to the replicas in turn, as a load balancer would send them.
		dial: func(id *identity.Identity) *grpc.ClientConn { return dialAt(addrs[int(next.Add(1))%len(addrs)], id) }}
	for _, addr := range addrs {
		a.conns = append(a.conns, dialAt(addr, nil))
	}
	a.conn = a.conns[0]
	return a
}

func benchCSR(b testing.TB) (*ecdsa.PrivateKey, []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		b.Fatal(err)
	}
	return key, der
}

// cryptoBound measures, in the same run, the pure crypto of one issuance:
// the CSR's signature checked once and the certificate signed. It times
// its own loop: testing.Benchmark cannot run inside a benchmark.
func cryptoBound(b *testing.B, h *ca.Hierarchy) float64 {
	_, der := benchCSR(b)
	id, _ := url.Parse("spiffe://td/agent/node")
	const n = 500
	start := time.Now()
	for range n {
		csr, err := ca.ParseCSR(der)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.Issuer(ca.RoleAgent).Issue(ca.LeafRequest{PublicKey: csr.PublicKey, SPIFFEID: id,
			CommonName: "node", ClientAuth: true, NotBefore: time.Now(), TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	return float64(time.Since(start).Nanoseconds()) / n
}

// report prints the throughput as a fraction of the crypto bound: 1.0
// would mean the store, RPC and audit cost nothing.
func report(b *testing.B, cryptoNs float64) {
	perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(cryptoNs, "crypto-ns/op")
	b.ReportMetric(cryptoNs/perOp, "of-crypto-bound")
}

// BenchmarkExchangeJoinToken: joins through gRPC over loopback TLS, each
// with its own node ID and CSR, with parallel clients as a fleet would.
func BenchmarkExchangeJoinToken(b *testing.B) { benchJoins(b, startBench(b)) }

func benchJoins(b *testing.B, a *benchAuthority) {
	// The server-side bound (loadgen.ServerPrimitives) of a join over a
	// kept connection: the clients here share their connections.
	tb, err := loadgen.MeasureBound(loadgen.OpTokenJoin, false)
	if err != nil {
		b.Fatal(err)
	}
	bound := float64(tb.PerOp.Nanoseconds())
	// CSRs are made by agents, not the authority: prepare them first.
	csrs := make([][]byte, 256)
	for i := range csrs {
		_, csrs[i] = benchCSR(b)
	}
	var clients []musterv1.BootstrapServiceClient
	for _, c := range a.conns {
		clients = append(clients, musterv1.NewBootstrapServiceClient(c))
	}
	var n atomic.Int64
	// A fleet joins many machines at once.
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := clients[i%int64(len(clients))].ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
				JoinToken: a.token, NodeId: fmt.Sprintf("node-%d", i), Csr: csrs[i%int64(len(csrs))]}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	report(b, bound)
}

// BenchmarkRenewal: renewals over mTLS by parallel agents, each renewing
// its own instance generation after generation. A renewal presents the
// newest certificate, so each one opens a new TLS connection, as an agent
// renewing twice a day does. Its bound is the renewal's as muster bench
// measures it (loadgen.MeasureBound): the server's side of the mTLS
// handshake, the CSR check and the certificate; the issuance alone (wall
// time) is reported beside it as issue-ns/op.
func BenchmarkRenewal(b *testing.B) { benchRenewals(b, startBench(b)) }

func benchRenewals(b *testing.B, a *benchAuthority) {
	issue := cryptoBound(b, a.h)
	renewal, err := loadgen.MeasureBound(loadgen.OpRenew, true)
	if err != nil {
		b.Fatal(err)
	}
	bound := float64(renewal.PerOp.Nanoseconds())
	boot := musterv1.NewBootstrapServiceClient(a.conn)
	type keyCSR struct {
		key *ecdsa.PrivateKey
		csr []byte
	}
	pool := make([]keyCSR, 64)
	for i := range pool {
		pool[i].key, pool[i].csr = benchCSR(b)
	}
	var agents atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		n := agents.Add(1)
		k := pool[n%int64(len(pool))]
		resp, err := boot.ExchangeJoinToken(context.Background(), &musterv1.ExchangeJoinTokenRequest{
			JoinToken: a.token, NodeId: fmt.Sprintf("agent-%d", n), Csr: k.csr})
		if err != nil {
			b.Error(err)
			return
		}
		chainPEM, key := resp.GetCertificateChainPem(), k.key
		for i := 0; pb.Next(); i++ {
			chain, _ := ca.ParseCertsPEM([]byte(chainPEM))
			conn := a.dial(&identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}})
			next := pool[(int(n)+i+1)%len(pool)]
			r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(context.Background(),
				&musterv1.RequestCertificateRequest{Csr: next.csr})
			conn.Close()
			if err != nil {
				b.Error(err)
				return
			}
			chainPEM, key = r.GetCertificateChainPem(), next.key
		}
	})
	b.StopTimer()
	b.ReportMetric(issue, "issue-ns/op")
	report(b, bound)
}

// BenchmarkHandshake is the floor under BenchmarkRenewal: a new mTLS
// connection with an agent certificate and one trivial RPC (health), both
// ends in this process, as in the renewal benchmark.
func BenchmarkHandshake(b *testing.B) {
	a := startBench(b)
	// One identity per goroutine: the authority caps the connections of
	// one agent (connsPerAgent), which 8 goroutines per CPU sharing one
	// would exceed.
	const parallelism = 8
	ids := make([]*identity.Identity, parallelism*runtime.GOMAXPROCS(0))
	for i := range ids {
		key, csr := benchCSR(b)
		resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(context.Background(),
			&musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: fmt.Sprintf("handshaker-%d", i), Csr: csr})
		if err != nil {
			b.Fatal(err)
		}
		chain, _ := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
		ids[i] = &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
	}
	var next atomic.Int32
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := ids[int(next.Add(1)-1)%len(ids)]
		for pb.Next() {
			conn := a.dial(id)
			_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			conn.Close()
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}
