package authority

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/identity"
	"github.com/muster-dev/muster/internal/store"
	"github.com/muster-dev/muster/internal/store/pgtest"
	"github.com/muster-dev/muster/internal/store/postgres"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// roundTrips records the round trips to PostgreSQL made while serving
// gRPC calls, by method: each Exec, Query or QueryRow is one (BEGIN and
// COMMIT included), and each batch is one, however many statements it
// carries. The authority's background work (signer keeper, leader lease,
// stream bookkeeping) runs outside any call and is not counted.
type roundTrips struct {
	mu    sync.Mutex
	trips map[string][]string
}

var sqlSpace = regexp.MustCompile(`\s+`)

func (r *roundTrips) add(ctx context.Context, sql string) {
	method, ok := grpc.Method(ctx)
	if !ok {
		return
	}
	sql = sqlSpace.ReplaceAllString(strings.TrimSpace(sql), " ")
	if len(sql) > 110 {
		sql = sql[:110] + "…"
	}
	r.mu.Lock()
	r.trips[method] = append(r.trips[method], sql)
	r.mu.Unlock()
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(ctx, d.SQL)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart records a batch as one round trip, naming each
// statement by its first words.
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var sqls []string
	kind := "batch"
	for _, q := range d.Batch.QueuedQueries {
		words := strings.Fields(q.SQL)
		sqls = append(sqls, strings.Join(words[:min(3, len(words))], " "))
		switch {
		case strings.HasPrefix(q.SQL, "SELECT pg_advisory_xact_lock(") && len(q.Arguments) == 1 && q.Arguments[0] == auditLockKey:
			kind += auditLockMark
		case q.SQL == "COMMIT":
			kind += commitMark
		}
	}
	r.add(ctx, kind+": "+strings.Join(sqls, " | "))
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// auditLockKey is the audit chain's advisory lock (package postgres);
// auditLockMark marks a recorded batch that takes it, and
// commitMark the batch's COMMIT.
const (
	auditLockKey  int64 = 0x6d75737465720002
	auditLockMark       = " (audit chain's lock)"
	commitMark          = " (COMMIT)"
)

// auditLockHeld counts the round trips of one call from the one that
// takes the audit chain's lock through the one carrying COMMIT: the lock
// is held over all but the last of them, 0 if it is never taken.
func auditLockHeld(sqls []string) int {
	from := -1
	for i, s := range sqls {
		if from < 0 && strings.Contains(s, auditLockMark) {
			from = i
		}
		if from >= 0 && (s == "COMMIT" || strings.Contains(s, commitMark+":")) {
			return i - from + 1
		}
	}
	return 0
}

// take returns and forgets what was recorded.
func (r *roundTrips) take() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trips
	r.trips = map[string][]string{}
	return t
}

// TestJoinRoundTripsPostgres counts the round trips to PostgreSQL of one
// token join, one PSK join, one renewal and one bound-keypair recovery,
// each after a first of its kind (pgx prepares a statement on its first
// use on a connection), and holds each to its budget: a change that adds
// one fails here. docs/performance.md "PostgreSQL" lists them.
func TestJoinRoundTripsPostgres(t *testing.T) {
	benchPGOnce.Do(func() { benchPG, benchPGErr = pgtest.Start() })
	pgtest.FailOrSkip(t, benchPGErr)
	url := benchPG.NewDatabase(t)
	rt := &roundTrips{trips: map[string][]string{}}
	a := startReplicas(t, func(ctx context.Context) (store.Store, error) {
		return postgres.Open(ctx, url, postgres.WithTracer(rt))
	}, 1)
	ctx := t.Context()
	boot := musterv1.NewBootstrapServiceClient(a.conn)
	certs := musterv1.NewCertificateServiceClient(a.conn)

	csr := func(cn string) (*ecdsa.PrivateKey, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
		if err != nil {
			t.Fatal(err)
		}
		return key, der
	}
	tokenJoin := func(node string) (*ecdsa.PrivateKey, string) {
		key, der := csr(node)
		resp, err := boot.ExchangeJoinToken(ctx, &musterv1.ExchangeJoinTokenRequest{JoinToken: a.token, NodeId: node, Csr: der})
		if err != nil {
			t.Fatal(err)
		}
		return key, resp.GetCertificateChainPem()
	}
	pskJoin := func(node string) {
		_, der := csr(node)
		if _, err := certs.RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: der, BootstrapPsk: a.psk}); err != nil {
			t.Fatal(err)
		}
	}
	renew := func(key *ecdsa.PrivateKey, chainPEM, node string) (*ecdsa.PrivateKey, string) {
		chain, err := ca.ParseCertsPEM([]byte(chainPEM))
		if err != nil {
			t.Fatal(err)
		}
		conn := a.dial(&identity.Identity{Chain: chain, Key: key, Roots: []*x509.Certificate{a.h.Root}})
		defer conn.Close()
		next, der := csr(node)
		r, err := musterv1.NewCertificateServiceClient(conn).RequestCertificate(ctx, &musterv1.RequestCertificateRequest{Csr: der})
		if err != nil {
			t.Fatal(err)
		}
		return next, r.GetCertificateChainPem()
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	botToken(t, a, "bot-1", 0, boundkeypair.ModeRelaxed, pub)
	var (
		state, botChain string
		botKey          *ecdsa.PrivateKey
	)
	recoverBot := func() {
		var der []byte
		botKey, der = csr("bot-1")
		res, err := joinBound(ctx, a, "bot-1", state, priv, der)
		if err != nil {
			t.Fatal(err)
		}
		state, botChain = res.JoinState, res.GetCertificateChainPem()
	}
	// A refresh: the bot presents its certificate and rotates its bound
	// key in the same exchange, so the renewal carries a key binding.
	refreshBot := func() {
		chain, err := ca.ParseCertsPEM([]byte(botChain))
		if err != nil {
			t.Fatal(err)
		}
		conn := a.dial(&identity.Identity{Chain: chain, Key: botKey, Roots: []*x509.Certificate{a.h.Root}})
		defer conn.Close()
		nextPub, nextPriv, _ := ed25519.GenerateKey(rand.Reader)
		next, err := boundkeypair.NewPublicKey(nextPub)
		if err != nil {
			t.Fatal(err)
		}
		key, der := csr("bot-1")
		res, err := agent.ExchangeBoundKeypair(ctx, musterv1.NewJoinServiceClient(conn), &musterv1.BoundKeypairInit{Token: "bot-1",
			NodeId: "bot-1", Csr: der, PreviousJoinState: state, NewPublicKey: next.String()},
			&agent.BoundKeys{Current: priv, Next: nextPriv}, a.info.AuthorityID)
		if err != nil {
			t.Fatal(err)
		}
		if res.BoundKeyFingerprint != next.Fingerprint() {
			t.Fatalf("refresh bound %s, want the new key %s", res.BoundKeyFingerprint, next.Fingerprint())
		}
		priv, botKey, botChain, state = nextPriv, key, res.GetCertificateChainPem(), res.JoinState
	}

	// The first of each, then the one counted.
	key, chain := tokenJoin("warm-1")
	renew(key, chain, "warm-1")
	pskJoin("warm-psk")
	recoverBot()
	refreshBot()
	recoverBot()
	key, chain = tokenJoin("warm-2")
	rt.take()

	// Before the batched reads and writes: 15, 14, 12 and 20 (a renewal
	// 4 and a refresh 5 before their read took the verifier set's ID
	// along); a
	// recovery was 8 and a rotating refresh 10 before their claims went
	// into the batches.
	budget := map[string]int{"token join": 5, "PSK join": 6, "renewal": 3, "bound-keypair recovery": 7,
		"bound-keypair refresh with rotation": 4}
	// Each appends its audit record in the batch that takes the chain's
	// lock and commits (chain.go in package postgres): before, the lock
	// went out with the writes and was held over the round trip that
	// brought the head back, 2.
	const lockBudget = 1
	count := func(op string, f func()) {
		f()
		var lines []string
		n, held := 0, 0
		for method, sqls := range rt.take() {
			n += len(sqls)
			held += auditLockHeld(sqls)
			lines = append(lines, method)
			for i, s := range sqls {
				lines = append(lines, fmt.Sprintf("  %2d %s", i+1, s))
			}
		}
		t.Logf("%s: %d round trips, %d with the audit chain's lock\n%s", op, n, held, strings.Join(lines, "\n"))
		if n > budget[op] {
			t.Errorf("%s: %d round trips to PostgreSQL, budget %d", op, n, budget[op])
		}
		if held != lockBudget {
			t.Errorf("%s: the audit chain's lock taken in %d round trips through COMMIT, want %d", op, held, lockBudget)
		}
	}
	count("token join", func() { tokenJoin("node-1") })
	count("PSK join", func() { pskJoin("psk-1") })
	count("renewal", func() { renew(key, chain, "warm-2") })
	count("bound-keypair recovery", recoverBot)
	count("bound-keypair refresh with rotation", refreshBot)
}
