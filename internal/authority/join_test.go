package authority

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/agent"
	"github.com/muster-dev/muster/internal/benchbound"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/ca"
	"github.com/muster-dev/muster/internal/errinfo"
	"github.com/muster-dev/muster/internal/loadgen"
	"github.com/muster-dev/muster/internal/seal"
	"github.com/muster-dev/muster/internal/signer"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// botToken stores a bound-keypair token for node with key bound statically.
func botToken(t testing.TB, a *benchAuthority, node string, limit int64, mode string, pub ed25519.PublicKey) {
	t.Helper()
	k, err := boundkeypair.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.store.InsertToken(context.Background(), store.Token{ID: node, JoinMethod: store.JoinMethodBoundKeypair,
		Ciphertext: []byte{}, Nonce: []byte{}, NodeID: node, CreatedBy: "test", CreatedAt: time.Now(),
		BoundKeypair: &store.BoundKeypair{Spec: store.BoundKeypairSpec{InitialPublicKey: k.String(), RecoveryLimit: limit,
			RecoveryMode: mode}, BoundPublicKey: k.String()}}, setupLink); err != nil {
		t.Fatal(err)
	}
}

// joinBound runs the bound-keypair stream as an agent does.
func joinBound(ctx context.Context, a *benchAuthority, node, joinState string, priv ed25519.PrivateKey, csr []byte) (*musterv1.BoundKeypairResult, error) {
	return agent.JoinBoundKeypair(ctx, musterv1.NewJoinServiceClient(a.conn), &musterv1.BoundKeypairInit{Token: node, NodeId: node,
		Csr: csr, PreviousJoinState: joinState}, priv, a.info.AuthorityID)
}

func wantStatus(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	if s := status.Convert(err); s.Code() != code || !strings.Contains(s.Message(), reason) {
		t.Fatalf("status %v %q, want %v %q", s.Code(), s.Message(), code, reason)
	}
}

func TestRegisterUsingBoundKeypair(t *testing.T) {
	a := startBench(t)
	ctx := t.Context()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	botToken(t, a, "bot-1", 2, boundkeypair.ModeStandard, pub)
	_, csr := benchCSR(t)

	first, err := joinBound(ctx, a, "bot-1", "", priv, csr)
	if err != nil {
		t.Fatalf("first join: %v", err)
	}
	leaf, err := ca.ParseCertsPEM([]byte(first.CertificateChainPem))
	if err != nil || leaf[0].Subject.CommonName != "bot-1" {
		t.Fatalf("certificate: %v", err)
	}
	if first.RecoveriesRemaining != 1 || first.JoinState == "" || first.AuthorityId != a.info.AuthorityID {
		t.Fatalf("result %+v", first)
	}
	// The verifier set comes with every bound-keypair join, as with a
	// token's, and the bound key is named.
	if vs, err := signer.NewTrust(first.VerifierSet, nil); err != nil || vs.Version() != 1 {
		t.Fatalf("verifier set in the result: %v (%q)", err, first.VerifierSet)
	}
	if k, _ := boundkeypair.NewPublicKey(pub); first.BoundKeyFingerprint != k.Fingerprint() {
		t.Fatalf("bound key fingerprint %q, want %q", first.BoundKeyFingerprint, k.Fingerprint())
	}
	// The join-state key is in the store, sealed under its own purpose.
	keys, err := a.store.ListJoinStateKeys(ctx)
	if err != nil || len(keys) != 1 {
		t.Fatalf("join-state keys %d, %v", len(keys), err)
	}
	js, _ := a.sk.Sealer(seal.InfoJoinState)
	if _, err := boundkeypair.OpenSigningKey(js, keys[0].ID, keys[0].Ciphertext, keys[0].Nonce); err != nil {
		t.Fatalf("join-state key does not open under its purpose: %v", err)
	}

	// A recovery with the join state; then the budget is spent.
	_, csr2 := benchCSR(t)
	second, err := joinBound(ctx, a, "bot-1", first.JoinState, priv, csr2)
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	if second.InstanceId == first.InstanceId || second.RecoveriesRemaining != 0 {
		t.Fatalf("recovery result %+v", second)
	}
	_, csr3 := benchCSR(t)
	_, err = joinBound(ctx, a, "bot-1", second.JoinState, priv, csr3)
	wantStatus(t, err, codes.FailedPrecondition, "recovery_exhausted")
	// The agent retries a spent budget by this reason, not the message.
	if r := errinfo.Reason(err); r != "recovery_exhausted" {
		t.Fatalf("spent budget: ErrorInfo reason %q, want recovery_exhausted", r)
	}

	// Another key fails the challenge; a stale join state locks.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	_, err = joinBound(ctx, a, "bot-1", second.JoinState, other, csr3)
	wantStatus(t, err, codes.Unauthenticated, "challenge_failed")
	_, err = joinBound(ctx, a, "bot-1", first.JoinState, priv, csr3)
	wantStatus(t, err, codes.PermissionDenied, "join_state_mismatch")
	_, err = joinBound(ctx, a, "bot-1", second.JoinState, priv, csr3)
	wantStatus(t, err, codes.PermissionDenied, "locked")

	// Refusals and the lock are audited.
	recs, err := a.store.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var denied, locks int
	for _, r := range recs {
		if r.Action == "lock.create" {
			locks++
		}
		if r.Action == "agent.join" && r.Result == "denied" {
			denied++
		}
	}
	if locks != 1 {
		t.Errorf("%d lock.create records, want 1", locks)
	}
	_ = denied // refusals go through the flood guard, which may aggregate them
}

func TestBoundKeypairStreamNeedsInitFirst(t *testing.T) {
	a := startBench(t)
	stream, err := musterv1.NewJoinServiceClient(a.conn).RegisterUsingBoundKeypair(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_ChallengeResponse{
		ChallengeResponse: "x"}}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantStatus(t, err, codes.InvalidArgument, "init")
}

// BenchmarkBoundKeypairRecovery: relaxed-mode recoveries through gRPC over
// loopback TLS, each agent presenting the join state of its last one,
// against the server-side bound of one recovery over a kept connection
// (loadgen.ServerPrimitives), measured in the same run (benchbound.Report).
func BenchmarkBoundKeypairRecovery(b *testing.B) {
	a := startBench(b)
	bound := serverBound(b, loadgen.OpBoundRecovery, false).PerOp
	var n atomic.Int64
	// CSRs are made by agents, not the authority: prepare one per
	// recovery first (as BenchmarkExchangeJoinToken does), so the timed
	// loop does not share the cores with the agents' key generation.
	csrs := make(chan []byte, b.N)
	for range b.N {
		_, csr := benchCSR(b)
		csrs <- csr
	}
	// Many agents at once, as a fleet recovering after an outage would.
	b.SetParallelism(16)
	b.ResetTimer()
	cpu0 := loadgen.ProcessCPU()
	b.RunParallel(func(pb *testing.PB) {
		node := fmt.Sprintf("bot-%d", n.Add(1))
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		botToken(b, a, node, 0, boundkeypair.ModeRelaxed, pub)
		state := ""
		for pb.Next() {
			csr := <-csrs
			res, err := joinBound(context.Background(), a, node, state, priv, csr)
			if err != nil {
				b.Error(err)
				return
			}
			state = res.JoinState
		}
	})
	b.StopTimer()
	benchbound.Report(b, bound, cpu0)
}
