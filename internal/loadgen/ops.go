package loadgen

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/h2window"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/spiffeid"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// The operations muster bench drives.
const (
	OpTokenJoin     = "token-join"
	OpPSKJoin       = "psk-join"
	OpRenew         = "renew"
	OpBoundRecovery = "bound-recovery"
	OpBoundRefresh  = "bound-refresh"
	OpStream        = "stream"
)

// Operations lists them, for help and errors.
var Operations = []string{OpTokenJoin, OpPSKJoin, OpRenew, OpBoundRecovery, OpBoundRefresh, OpStream}

// presentsCertificate is whether op's requests present the simulated
// agent's newest certificate, which changes at every answer.
func presentsCertificate(op string) bool { return op == OpRenew || op == OpBoundRefresh }

// Connection modes: a new TLS connection per request, as a real agent
// makes one; one connection per simulated agent kept for the run; or a
// connection per request opened and readied before the clock (RunKept).
const (
	ConnNew    = "new"
	ConnShared = "shared"
	ConnKept   = "kept"
)

// keptOps are the operations that run with ConnKept.
var keptOps = []string{OpRenew, OpTokenJoin, OpPSKJoin}

// Setup says what to prepare and where the authority is.
type Setup struct {
	Op         string
	Addr       string
	Connection string
	// Concurrency is the number of simulated agents: renewals and
	// recoveries prepare one identity or bot each.
	Concurrency int
	// Prepared is how many join requests (each its own node and CSR)
	// are made before the clock starts.
	Prepared int
	// Batch is, with ConnKept, how many connections are opened before
	// each batch of requests (RunKept): renewals prepare that many
	// agents, each renewed once a batch.
	Batch int
	// UnlimitedToken: token-join joins with a token of unlimited uses
	// (uses 0) rather than one of Prepared uses; a store may take the two
	// kinds' uses differently.
	UnlimitedToken bool
	// Operator is the identity the admin API was reached with: its roots
	// are the ones simulated agents pin.
	Operator *identity.Identity
	Admin    musterv1.AdminServiceClient
	// Log, if set, says what the setup does.
	Log func(format string, args ...any)
	// Pprof, with OpStream, is the authority's --pprof-listen address:
	// its goroutines are counted before the joins, so that RunStreams
	// can wait for the joins' connections to be gone at the authority
	// before it reads the authority's memory.
	Pprof string
}

// Prepared is an operation ready to run; Close removes what the setup
// created that would otherwise stay usable (the join token).
type Prepared struct {
	Operation
	// Streams is set instead of Operation for the stream operation,
	// which is run by RunStreams.
	Streams *Streams
	Close   func(ctx context.Context) error
}

// target is the authority as the simulated agents see it.
type target struct {
	addr     string
	roots    *x509.CertPool
	rootList []*x509.Certificate
	match    identity.Matcher
	shared   bool
	// loopback: the authority is on this machine's loopback, so each
	// simulated agent connects from its own 127.x.y.z address, as a
	// fleet comes from many addresses (the per-source rate limit of
	// unauthenticated calls would otherwise throttle the whole run).
	loopback bool
	conns    []*grpc.ClientConn
	// run names the nodes and tokens of this run apart from others.
	run         string
	authorityID spiffeid.ID
}

// Prepare creates what op needs through the admin API and makes every key
// and CSR the run will send, so the timed part sends requests only.
func Prepare(ctx context.Context, s Setup) (*Prepared, error) {
	if s.Connection == "" {
		s.Connection = ConnNew
	}
	if s.Connection != ConnNew && s.Connection != ConnShared && s.Connection != ConnKept {
		return nil, fmt.Errorf("loadgen: connection %q: want %s, %s or %s", s.Connection, ConnNew, ConnShared, ConnKept)
	}
	if s.Connection == ConnKept && !slices.Contains(keptOps, s.Op) {
		return nil, fmt.Errorf("loadgen: --connection %s is for %s", ConnKept, strings.Join(keptOps, ", "))
	}
	if s.Connection == ConnKept && s.Batch < 1 {
		return nil, fmt.Errorf("loadgen: --connection %s: a batch of %d: want at least 1", ConnKept, s.Batch)
	}
	if s.Connection == ConnShared && s.Op == OpStream {
		return nil, errors.New("loadgen: each agent stream is a connection of its own (--connection shared is for joins)")
	}
	if s.Connection == ConnShared && presentsCertificate(s.Op) {
		return nil, errors.New("loadgen: renewals and refreshes need a new connection each: a connection presents one certificate, and a renewal must present the newest (the authority treats an older one as a copy)")
	}
	if s.Log == nil {
		s.Log = func(string, ...any) {}
	}
	st, err := s.Admin.GetStatus(ctx, &musterv1.GetStatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("loadgen: authority status: %w", err)
	}
	authID, err := spiffeid.New(st.GetTrustDomain(), spiffeid.RoleAuthority, st.GetAuthorityId())
	if err != nil {
		return nil, fmt.Errorf("loadgen: authority ID: %w", err)
	}
	runID := make([]byte, 4)
	rand.Read(runID)
	t := &target{addr: s.Addr, roots: s.Operator.RootPool(), rootList: s.Operator.Roots, match: identity.MatchID(authID),
		shared: s.Connection == ConnShared, run: "bench-" + hex.EncodeToString(runID), authorityID: authID}
	// Only a literal IPv4 loopback address: a name may resolve to ::1,
	// which no 127.x.y.z source can reach.
	if host, _, err := net.SplitHostPort(s.Addr); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() && ip.IsLoopback() {
			t.loopback = true
		}
	}
	if t.shared {
		t.conns = make([]*grpc.ClientConn, s.Concurrency)
		for w := range t.conns {
			if t.conns[w], err = t.dial(int64(w), nil); err != nil {
				return nil, err
			}
		}
	}
	var p *Prepared
	switch s.Op {
	case OpTokenJoin:
		p, err = prepareTokenJoin(ctx, s, t)
	case OpPSKJoin:
		p, err = preparePSKJoin(ctx, s, t)
	case OpRenew:
		p, err = prepareRenew(ctx, s, t)
	case OpBoundRecovery:
		p, err = prepareBots(ctx, s, t, false)
	case OpBoundRefresh:
		p, err = prepareBots(ctx, s, t, true)
	case OpStream:
		p, err = prepareStreams(ctx, s, t)
	default:
		err = fmt.Errorf("loadgen: unknown operation %q (want one of %v)", s.Op, Operations)
	}
	if err != nil {
		t.close()
		return nil, err
	}
	inner := p.Close
	p.Close = func(ctx context.Context) error {
		t.close()
		if inner != nil {
			return inner(ctx)
		}
		return nil
	}
	return p, nil
}

func (t *target) close() {
	for _, c := range t.conns {
		if c != nil {
			c.Close()
		}
	}
}

// sourceAddr is the loopback address simulated agent n connects from:
// 127.1.0.1 onwards, skipping .0 and .255.
func sourceAddr(n int64) net.IP {
	n %= 254 * 256 * 254
	return net.IPv4(127, byte(1+n/(256*254)), byte(n/254%256), byte(1+n%254))
}

// dial makes a connection to the authority pinned to its ID, presenting
// id if not nil, from source address n when on loopback.
func (t *target) dial(n int64, id *identity.Identity, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append(h2window.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(identity.ClientTLS(id, t.roots, t.match))),
		grpc.WithUnaryInterceptor(agentDeadline))
	opts = append(opts, extra...)
	if t.loopback {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: sourceAddr(n)}}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	return grpc.NewClient(t.addr, opts...)
}

// agentDeadline gives a unary call without a deadline the one muster agent
// gives each of its calls (agent.DefaultTimeout). The authority ends a call
// with none at its own call timeout, and setting that deadline costs it
// about a dozen allocations a call that an agent's call does not.
func agentDeadline(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, agent.DefaultTimeout)
		defer cancel()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// call runs f on the worker's shared connection, or on a new one from its
// own source that is closed after, as an agent's is.
func (t *target) call(worker int, seq int64, id *identity.Identity, f func(*grpc.ClientConn) error) error {
	if t.shared {
		return f(t.conns[worker])
	}
	conn, err := t.dial(seq, id)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(conn)
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// keyCSR is a key and a CSR for it, made before the run.
type keyCSR struct {
	key *ecdsa.PrivateKey
	csr []byte
}

func makeCSRs(n int, cn func(i int) string) ([]keyCSR, error) {
	out := make([]keyCSR, n)
	for i := range out {
		key, err := newKey()
		if err != nil {
			return nil, err
		}
		var tmpl x509.CertificateRequest
		if cn != nil {
			tmpl.Subject = pkix.Name{CommonName: cn(i)}
		}
		csr, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
		if err != nil {
			return nil, err
		}
		out[i] = keyCSR{key, csr}
	}
	return out, nil
}

// csrPool is how many distinct keys renewals and token joins cycle
// through: the authority never sees two uses of one by one node in a row.
const csrPool = 256

// createToken makes a join token for the run, valid for an hour, with
// uses uses.
func createToken(ctx context.Context, s Setup, t *target, uses int64) (secret, id string, err error) {
	resp, err := s.Admin.CreateToken(ctx, &musterv1.CreateTokenRequest{Ttl: durationpb.New(time.Hour), Uses: &uses,
		Description: "muster bench " + t.run})
	if err != nil {
		return "", "", fmt.Errorf("loadgen: create a join token: %w", err)
	}
	return resp.GetToken(), resp.GetInfo().GetId(), nil
}

func deleteToken(s Setup, id string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := s.Admin.DeleteToken(ctx, &musterv1.DeleteTokenRequest{Id: id})
		return err
	}
}

// tokenJoin is ExchangeJoinToken with a node ID of its own per request.
type tokenJoin struct {
	t     *target
	token string
	csrs  []keyCSR
	max   int64
}

func prepareTokenJoin(ctx context.Context, s Setup, t *target) (*Prepared, error) {
	s.Log("setup: a join token for %d joins, %d keys and CSRs", s.Prepared, csrPool)
	csrs, err := makeCSRs(csrPool, nil)
	if err != nil {
		return nil, err
	}
	uses := int64(s.Prepared)
	if s.UnlimitedToken {
		uses = 0
	}
	secret, id, err := createToken(ctx, s, t, uses)
	if err != nil {
		return nil, err
	}
	return &Prepared{Operation: &tokenJoin{t: t, token: secret, csrs: csrs, max: int64(s.Prepared)}, Close: deleteToken(s, id)}, nil
}

func (j *tokenJoin) Do(ctx context.Context, worker int, seq int64) error {
	if seq >= j.max {
		return ErrExhausted
	}
	return j.t.call(worker, seq, nil, func(conn *grpc.ClientConn) error { return j.doOn(ctx, conn, seq) })
}

func (j *tokenJoin) doOn(ctx context.Context, conn *grpc.ClientConn, seq int64) error {
	_, err := musterv1.NewBootstrapServiceClient(conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: j.token, NodeId: fmt.Sprintf("%s-%d", j.t.run, seq), Csr: j.csrs[seq%csrPool].csr})
	return err
}

// A kept join's connection comes from the request's own source, as a
// new one would.
func (j *tokenJoin) keptDial(seq int64) (*grpc.ClientConn, error) { return j.t.dial(seq, nil) }
func (j *tokenJoin) keptLimits() (int64, int)                     { return j.max, 0 }

// pskJoin is RequestCertificate with the bootstrap PSK; the node ID is
// the CSR's common name, so every request has a CSR of its own.
type pskJoin struct {
	t    *target
	psk  string
	csrs []keyCSR
}

func preparePSKJoin(ctx context.Context, s Setup, t *target) (*Prepared, error) {
	resp, err := s.Admin.GetPSKs(ctx, &musterv1.GetPSKsRequest{})
	if err != nil {
		return nil, fmt.Errorf("loadgen: read the bootstrap PSK: %w", err)
	}
	s.Log("setup: the bootstrap PSK read through the admin API; %d keys and CSRs", s.Prepared)
	csrs, err := makeCSRs(s.Prepared, func(i int) string { return fmt.Sprintf("%s-%d", t.run, i) })
	if err != nil {
		return nil, err
	}
	return &Prepared{Operation: &pskJoin{t: t, psk: resp.GetActive().GetPsk(), csrs: csrs}}, nil
}

func (j *pskJoin) Do(ctx context.Context, worker int, seq int64) error {
	if seq >= int64(len(j.csrs)) {
		return ErrExhausted
	}
	return j.t.call(worker, seq, nil, func(conn *grpc.ClientConn) error { return j.doOn(ctx, conn, seq) })
}

func (j *pskJoin) doOn(ctx context.Context, conn *grpc.ClientConn, seq int64) error {
	_, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{
		Csr: j.csrs[seq].csr, BootstrapPsk: j.psk})
	return err
}

func (j *pskJoin) keptDial(seq int64) (*grpc.ClientConn, error) { return j.t.dial(seq, nil) }
func (j *pskJoin) keptLimits() (int64, int)                     { return int64(len(j.csrs)), 0 }

// renew is one agent per worker renewing its instance generation after
// generation over a new mTLS connection each time; with ConnKept, one
// agent per connection of a batch, each renewed once a batch over a
// connection opened before (RunKept).
type renew struct {
	t      *target
	agents []*identity.Identity
	csrs   []keyCSR
}

func prepareRenew(ctx context.Context, s Setup, t *target) (*Prepared, error) {
	n := s.Concurrency
	if s.Connection == ConnKept {
		n = s.Batch
	}
	s.Log("setup: joining %d agents to renew, %d keys and CSRs", n, csrPool)
	csrs, err := makeCSRs(csrPool+n, nil)
	if err != nil {
		return nil, err
	}
	secret, id, err := createToken(ctx, s, t, int64(n))
	if err != nil {
		return nil, err
	}
	defer deleteToken(s, id)(ctx)
	r := &renew{t: t, csrs: csrs[:csrPool], agents: make([]*identity.Identity, n)}
	// A batch of kept connections may need thousands of agents: they
	// are joined by --concurrency at once, each from its own source.
	if err := joinAll(ctx, s, n, s.Concurrency, func(w int) error {
		return r.join(ctx, secret, w, csrs[csrPool+w])
	}); err != nil {
		return nil, err
	}
	return &Prepared{Operation: r}, nil
}

func (r *renew) join(ctx context.Context, secret string, w int, k keyCSR) error {
	conn, err := r.t.dial(int64(w), nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := musterv1.NewBootstrapServiceClient(conn).ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{
		JoinToken: secret, NodeId: fmt.Sprintf("%s-%d", r.t.run, w), Csr: k.csr})
	if err != nil {
		return fmt.Errorf("loadgen: join agent %d to renew: %w", w, err)
	}
	r.agents[w], err = r.t.identity(resp.GetCertificateChainPem(), k.key)
	return err
}

// identity is a simulated agent's identity from the chain the authority
// answered and the key it certified.
func (t *target) identity(chainPEM string, key *ecdsa.PrivateKey) (*identity.Identity, error) {
	chain, err := ca.ParseCertsPEM([]byte(chainPEM))
	if err != nil {
		return nil, fmt.Errorf("loadgen: the authority's chain: %w", err)
	}
	return &identity.Identity{Chain: chain, Key: key, Roots: t.rootList}, nil
}

func (r *renew) Do(ctx context.Context, worker int, seq int64) error {
	return r.t.call(worker, int64(worker), r.agents[worker], func(conn *grpc.ClientConn) error {
		return r.renewOn(ctx, conn, worker, r.csrs[seq%csrPool])
	})
}

// renewOn renews agent i over conn, which presents its newest
// certificate, with the key next, and keeps the answer as its newest.
func (r *renew) renewOn(ctx context.Context, conn *grpc.ClientConn, i int, next keyCSR) error {
	resp, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: next.csr})
	if err != nil {
		return err
	}
	id, err := r.t.identity(resp.GetCertificateChainPem(), next.key)
	if err != nil {
		return err
	}
	r.agents[i] = id
	return nil
}

// With ConnKept, request seq is agent seq mod the agents' count, over a
// connection presenting that agent's newest certificate from its own
// source; a batch holds at most one request per agent.
func (r *renew) keptDial(seq int64) (*grpc.ClientConn, error) {
	i, _ := keptAgent(seq, len(r.agents))
	return r.t.dial(int64(i), r.agents[i])
}

func (r *renew) doOn(ctx context.Context, conn *grpc.ClientConn, seq int64) error {
	i, round := keptAgent(seq, len(r.agents))
	return r.renewOn(ctx, conn, i, r.csrs[keptKey(i, round)])
}

func (r *renew) keptLimits() (int64, int) { return -1, len(r.agents) }

// keptAgent is the agent of kept renewal seq among n agents and the
// batch (round) it is in.
func keptAgent(seq int64, n int) (agent int, round int64) {
	return int(seq % int64(n)), seq / int64(n)
}

// keptKey is the key (of csrPool) agent i renews with in round: from
// one round to the next an agent asks for a key other than the one it
// holds, as a renewal with a fresh key does.
func keptKey(i int, round int64) int { return int((int64(i) + round) % csrPool) }

// bots are one bound-keypair bot per worker joining again and again with
// its bound key and the last join state: without a certificate each join
// is a recovery, answered with a new instance; with its valid certificate
// (refresh) it is a refresh of the current instance, which consumes
// nothing.
type bots struct {
	t       *target
	refresh bool
	bots    []bot
	csrs    []keyCSR
}

type bot struct {
	name string
	key  ed25519.PrivateKey
	// state is the join state of the bot's last join, presented at the
	// next as an agent presents the one in its state.json.
	state string
	// id is the bot's newest certificate, presented by a refresh.
	id *identity.Identity
}

func prepareBots(ctx context.Context, s Setup, t *target, refresh bool) (*Prepared, error) {
	s.Log("setup: %d bound-keypair bots, %d keys and CSRs", s.Concurrency, csrPool)
	// The first joins have keys of their own: a bot's next join with
	// the key of its last would be answered as the retry of a lost reply.
	csrs, err := makeCSRs(csrPool+s.Concurrency, nil)
	if err != nil {
		return nil, err
	}
	r := &bots{t: t, refresh: refresh, csrs: csrs[:csrPool], bots: make([]bot, s.Concurrency)}
	for w := range r.bots {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		pk, err := boundkeypair.NewPublicKey(pub)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("%s-bot-%d", t.run, w)
		// Standard mode, the default: each recovery presents the last
		// join state and counts against the limit, set high enough
		// never to be the answer.
		if _, err := s.Admin.ApplyToken(ctx, &musterv1.ApplyTokenRequest{Name: name, NodeId: name, CreateOnly: true,
			BoundKeypair: &musterv1.BoundKeypairSpec{InitialPublicKey: pk.String(), RecoveryLimit: maxRecoveryLimit,
				RecoveryMode: boundkeypair.ModeStandard}}); err != nil {
			return nil, fmt.Errorf("loadgen: create bot %s: %w", name, err)
		}
		r.bots[w] = bot{name: name, key: priv}
		// The first join binds the instance; every later one recovers
		// or refreshes.
		if err := r.join(ctx, w, int64(w), csrs[csrPool+w]); err != nil {
			return nil, fmt.Errorf("loadgen: first join of bot %s: %w", name, err)
		}
	}
	return &Prepared{Operation: r, Close: func(ctx context.Context) error {
		var errs []error
		for _, b := range r.bots {
			if _, err := s.Admin.DeleteToken(ctx, &musterv1.DeleteTokenRequest{Id: b.name}); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}}, nil
}

func (r *bots) join(ctx context.Context, worker int, seq int64, k keyCSR) error {
	b := &r.bots[worker]
	var client *identity.Identity
	if r.refresh {
		client = b.id
	}
	var chainPEM string
	err := r.t.call(worker, seq, client, func(conn *grpc.ClientConn) error {
		res, err := agent.JoinBoundKeypair(ctx, musterv1.NewJoinServiceClient(conn), &musterv1.BoundKeypairInit{Token: b.name,
			NodeId: b.name, Csr: k.csr, PreviousJoinState: b.state}, b.key, r.t.authorityID.Name)
		if err == nil {
			b.state, chainPEM = res.GetJoinState(), res.GetCertificateChainPem()
		}
		return err
	})
	if err != nil || !r.refresh {
		return err
	}
	b.id, err = r.t.identity(chainPEM, k.key)
	return err
}

func (r *bots) Do(ctx context.Context, worker int, seq int64) error {
	return r.join(ctx, worker, seq, r.csrs[seq%csrPool])
}

// maxRecoveryLimit is the largest recovery limit the authority accepts.
const maxRecoveryLimit = 1 << 20
