package discoveryd

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/discovery"
	"github.com/muster-dev/muster/internal/discoveryclient"
	"github.com/muster-dev/muster/internal/referral"
	"github.com/muster-dev/muster/internal/store/sqlite"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// env is a discovery running in-process on loopback with a temporary
// SQLite store, and a client pinned to it.
type env struct {
	t      *testing.T
	dir    string
	st     *sqlite.SQLite
	srv    *Server
	addr   string
	conn   *grpc.ClientConn
	client musterv1.DiscoveryServiceClient
	stop   func()
}

type option func(*Server)

// allowing replaces the open registration of run with an allow-list.
func allowing(open bool, entries ...discovery.AllowEntry) option {
	return func(s *Server) {
		l, err := discovery.NewAllowlist(entries, open)
		if err != nil {
			panic(err)
		}
		s.allow = l
	}
}

// generous lifts discovery's own per-source limits, so a test can send
// many requests from loopback.
func generous(s *Server) {
	s.sourceLimit = bucket{1e6, 1e6}
	s.reportLimit = bucket{1e6, 1e6}
}

func start(t *testing.T, opts ...option) *env {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "discovery")
	if _, err := Init(dir); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), Dir(dir).DatabaseFile())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dir: dir, st: st}
	e.run(opts...)
	return e
}

// run starts a server on the env's directory and store. Registration is
// open, so a test registers whatever authority it makes; allowing sets an
// allow-list instead.
func (e *env) run(opts ...option) {
	t := e.t
	t.Helper()
	ready := make(chan string, 1)
	srv, err := New(Config{
		Dir: e.dir, Store: e.st, Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
		Log:              slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:            func(addr string) { ready <- addr },
		OpenRegistration: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	select {
	case e.addr = <-ready:
	case err := <-done:
		t.Fatalf("discovery stopped at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("discovery did not start in 20s")
	}
	e.srv = srv
	conn, err := discoveryclient.Dial(e.addr, srv.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}
	e.conn, e.client = conn, musterv1.NewDiscoveryServiceClient(conn)
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after the context ended", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("discovery did not stop within 20s")
		}
	}
	t.Cleanup(e.stop)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// authority is a real authority hierarchy that registers with discovery.
type authority struct {
	h  *ca.Hierarchy
	id string
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	h, err := ca.Create(name, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &authority{h: h, id: ca.AuthorityID(name, h.Fingerprint())}
}

// openPolicy lets any source ask for any node often, with no quota.
func openPolicy() discovery.Policy {
	return discovery.Policy{RateLimits: discovery.RateLimits{
		PerNodeSource: discovery.Rate{PerMinute: 1e6, Burst: 1e6},
		PerSource:     discovery.Rate{PerMinute: 1e6, Burst: 1e6},
		PerAuthority:  discovery.Rate{PerMinute: 1e6, Burst: 1e6},
	}}
}

func policyJSON(t *testing.T, p discovery.Policy) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// registration is a signed registration of a, as the authority sends it.
func (a *authority) registration(t *testing.T, version int64, p discovery.Policy, endpoints ...string) *musterv1.RegisterAuthorityRequest {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = []string{"authority.example:7443"}
	}
	reg := discovery.Registration{
		AuthorityID:          a.id,
		Endpoints:            endpoints,
		CABundlePEM:          string(ca.EncodeCertPEM(a.h.Root)),
		Policy:               policyJSON(t, p),
		Version:              version,
		PolicyCertificatePEM: string(ca.EncodeCertPEM(a.h.Issuer(ca.RolePolicy).Cert)),
	}
	return a.sign(t, reg, a.h.Issuer(ca.RolePolicy))
}

// sign signs reg with signer's key and names signer's certificate.
func (a *authority) sign(t *testing.T, reg discovery.Registration, signer *ca.Issuer) *musterv1.RegisterAuthorityRequest {
	t.Helper()
	reg.PolicyCertificatePEM = string(ca.EncodeCertPEM(signer.Cert))
	_, sig, err := reg.Sign(signer.Key)
	if err != nil {
		t.Fatal(err)
	}
	return requestOf(reg, sig)
}

func requestOf(reg discovery.Registration, sig []byte) *musterv1.RegisterAuthorityRequest {
	return &musterv1.RegisterAuthorityRequest{AuthorityId: reg.AuthorityID, Endpoints: reg.Endpoints, CaBundlePem: reg.CABundlePEM,
		PolicyJson: string(reg.Policy), Version: reg.Version, PolicyCertificatePem: reg.PolicyCertificatePEM, Signature: sig}
}

func (e *env) register(a *authority, version int64, p discovery.Policy) {
	e.t.Helper()
	if _, err := e.client.RegisterAuthority(ctxT(e.t), a.registration(e.t, version, p)); err != nil {
		e.t.Fatalf("RegisterAuthority: %v", err)
	}
}

// report is a join report of a, signed with its policy key.
func (a *authority) report(t *testing.T, node, instance string) *musterv1.ReportJoinRequest {
	t.Helper()
	r := discovery.JoinReport{AuthorityID: a.id, NodeID: node, InstanceID: instance, TicketID: referral.NewID(), JoinedAt: time.Now().UTC()}
	sig, err := r.Sign(a.h.Issuer(ca.RolePolicy).Key)
	if err != nil {
		t.Fatal(err)
	}
	return &musterv1.ReportJoinRequest{AuthorityId: r.AuthorityID, NodeId: r.NodeID, InstanceId: r.InstanceID, TicketId: r.TicketID,
		JoinedAt: timestamppb.New(r.JoinedAt), Signature: sig}
}

// verifier checks tickets for a the way the authority does: against the
// JWKS discovery serves, fetched over the pinned connection.
func (e *env) verifier(a *authority) *referral.Verifier {
	fp := e.srv.Fingerprint()
	return &referral.Verifier{
		Keys: &referral.KeyCache{Fetch: func(ctx context.Context) ([]byte, error) {
			return discoveryclient.FetchJWKS(ctx, e.addr, fp)
		}},
		Issuer:      discoveryclient.Issuer(e.addr),
		AuthorityID: a.id,
		Now:         time.Now,
	}
}

func (e *env) jwks() []byte {
	e.t.Helper()
	data, err := discoveryclient.FetchJWKS(ctxT(e.t), e.addr, e.srv.Fingerprint())
	if err != nil {
		e.t.Fatal(err)
	}
	return data
}

// counter reads a counter's value.
func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
