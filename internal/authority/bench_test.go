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
	"math"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/muster-dev/muster/internal/benchbound"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/datadir"
	"github.com/muster-dev/muster/internal/h2window"
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
		if _, ok := b.(*testing.B); ok {
			// A benchmark renews its agents back to back, far more often
			// than their certificates' lifetime allows.
			cfg.RenewalsPerLifetime = math.MaxInt32
		}
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
		CreatedBy: "bench", CreatedAt: time.Now()}, setupLink); err != nil {
		b.Fatal(err)
	}
	want, _ := spiffeid.New(res.Info.TrustDomain, spiffeid.RoleAuthority, res.Info.AuthorityID)
	var next atomic.Int64
	dialAt := func(addr string, id *identity.Identity) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, append(h2window.DialOptions(),
			grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, h.RootPool(), identity.MatchID(want)))))...)
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

// joinedIdentity joins node with the bench's join token and returns the
// identity the authority issued it, pinning the bench's root.
func (a *benchAuthority) joinedIdentity(t *testing.T, node string) *identity.Identity {
	t.Helper()
	key, der := benchCSR(t)
	resp, err := musterv1.NewBootstrapServiceClient(a.conn).ExchangeJoinToken(t.Context(), &musterv1.ExchangeJoinTokenRequest{
		JoinToken: a.token, NodeId: node, Csr: der})
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.ParseCertsPEM([]byte(resp.GetCertificateChainPem()))
	if err != nil {
		t.Fatal(err)
	}
	return &identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}}
}

// serverBound is the server-side bound of op as muster bench measures it
// (loadgen.MeasureBound: the crypto the authority must do for one
// request, each primitive the best of its rounds of one thread's CPU
// time), over a new connection or a kept one.
func serverBound(b *testing.B, op string, newConn bool) *loadgen.Bound {
	bound, err := loadgen.MeasureBound(op, newConn)
	if err != nil {
		b.Fatal(err)
	}
	return bound
}

// BenchmarkExchangeJoinToken: joins through gRPC over loopback TLS, each
// with its own node ID and CSR, with parallel clients as a fleet would.
func BenchmarkExchangeJoinToken(b *testing.B) { benchJoins(b, startBench(b)) }

func benchJoins(b *testing.B, a *benchAuthority) {
	// The server-side bound (loadgen.ServerPrimitives) of a join over a
	// kept connection: the clients here share their connections.
	bound := serverBound(b, loadgen.OpTokenJoin, false).PerOp
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
	cpu0 := loadgen.ProcessCPU()
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
	benchbound.Report(b, bound, cpu0)
}

// BenchmarkRenewal: renewals over mTLS by parallel agents, each renewing
// its own instance generation after generation. A renewal presents the
// newest certificate, so each one opens a new TLS connection, as an agent
// renewing twice a day does. Its bound is the renewal's over a new
// connection as muster bench measures it (loadgen.MeasureBound): the
// server's side of the mTLS handshake, the CSR check and the certificate;
// the bound without the handshake (the CSR check and the certificate) is
// reported beside it as kept-bound-ns/op.
func BenchmarkRenewal(b *testing.B) { benchRenewals(b, startBench(b)) }

func benchRenewals(b *testing.B, a *benchAuthority) {
	renewal := serverBound(b, loadgen.OpRenew, true)
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
	cpu0 := loadgen.ProcessCPU()
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
	b.ReportMetric(float64(renewal.KeptConnection.Nanoseconds()), "kept-bound-ns/op")
	benchbound.Report(b, renewal.PerOp, cpu0)
}

// BenchmarkHandshake is the floor under BenchmarkRenewal: a new mTLS
// connection with an agent certificate and one trivial RPC (health), both
// ends in this process, as in the renewal benchmark. Its bound is the
// renewal bound's handshake: the server's side of a new connection that
// presents the agent's certificate.
func BenchmarkHandshake(b *testing.B) {
	a := startBench(b)
	renewal := serverBound(b, loadgen.OpRenew, true)
	handshake := renewal.PerOp - renewal.KeptConnection
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
	cpu0 := loadgen.ProcessCPU()
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
	b.StopTimer()
	benchbound.Report(b, handshake, cpu0)
}
