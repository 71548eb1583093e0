package authority

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/muster-dev/muster/internal/audit"
	"github.com/muster-dev/muster/internal/boundkeypair"
	"github.com/muster-dev/muster/internal/store"
	musterv1 "github.com/muster-dev/muster/proto/muster/v1"
)

// TestBoundKeypairClientGoesAway: a caller that cancels its stream after
// the challenge is audited as a cancellation, not as a refusal of a bad
// request (INVALID_ARGUMENT), while one that closes its side of the stream
// instead of answering is still that refusal.
func TestBoundKeypairClientGoesAway(t *testing.T) {
	a := startBench(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	botToken(t, a, "bot-1", 5, boundkeypair.ModeStandard, pub)
	_, csr := benchCSR(t)

	for _, tc := range []struct {
		name string
		end  func(stream musterv1.JoinService_RegisterUsingBoundKeypairClient, cancel context.CancelFunc)
		want string // the audit reason's start
		res  string
	}{
		{"cancelled", func(_ musterv1.JoinService_RegisterUsingBoundKeypairClient, cancel context.CancelFunc) { cancel() },
			"canceled: the caller went away", audit.ResultError},
		{"closed", func(s musterv1.JoinService_RegisterUsingBoundKeypairClient, _ context.CancelFunc) { s.CloseSend() },
			"the challenge was not answered: the stream ended first", audit.ResultDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: "agent.join"})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stream, err := musterv1.NewJoinServiceClient(a.conn).RegisterUsingBoundKeypair(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{
				Init: &musterv1.BoundKeypairInit{Token: "bot-1", NodeId: "bot-1", Csr: csr}}}); err != nil {
				t.Fatal(err)
			}
			if msg, err := stream.Recv(); err != nil || len(msg.GetChallenge()) == 0 {
				t.Fatalf("no challenge: %v %v", msg, err)
			}
			tc.end(stream, cancel)
			deadline := time.Now().Add(10 * time.Second)
			for {
				recs, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: "agent.join", AfterSeq: lastSeq(before)})
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) > 0 {
					r := recs[len(recs)-1]
					if r.Result != tc.res || !strings.HasPrefix(strings.ToLower(r.Reason), tc.want) {
						t.Fatalf("audited %s %q, want %s %q…", r.Result, r.Reason, tc.res, tc.want)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("the join was not audited")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func lastSeq(recs []store.AuditRecord) int64 {
	if len(recs) == 0 {
		return 0
	}
	return recs[len(recs)-1].Seq
}

// TestBoundKeypairUnansweredStreamEnds: a caller that opens the exchange
// and then sends nothing — no init, or no answer to the challenge — is
// not waited for past the challenge's lifetime: its stream ends
// DEADLINE_EXCEEDED, and the refusal is audited.
func TestBoundKeypairUnansweredStreamEnds(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	a := startReplicasWith(t, nil, 1, func(c *Config) { c.BoundKeypairChallengeTTL = ttl })
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	botToken(t, a, "bot-1", 5, boundkeypair.ModeStandard, pub)
	_, csr := benchCSR(t)

	for _, tc := range []struct {
		name, action, reason string
		init                 bool
	}{
		{"no answer to the challenge", "agent.join", "the challenge was not answered in time", true},
		{"no init", "api.access", "no init within 2s", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: tc.action})
			if err != nil {
				t.Fatal(err)
			}
			// The caller would wait far longer than the authority may.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			stream, err := musterv1.NewJoinServiceClient(a.conn).RegisterUsingBoundKeypair(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tc.init {
				if err := stream.Send(&musterv1.RegisterUsingBoundKeypairRequest{Payload: &musterv1.RegisterUsingBoundKeypairRequest_Init{
					Init: &musterv1.BoundKeypairInit{Token: "bot-1", NodeId: "bot-1", Csr: csr}}}); err != nil {
					t.Fatal(err)
				}
				ch, err := stream.Recv()
				if err != nil || len(ch.GetChallenge()) == 0 {
					t.Fatalf("no challenge: %v %v", ch, err)
				}
				c, err := boundkeypair.ParseChallenge(ch.GetChallenge())
				if err != nil || c.Expiry.Sub(c.IssuedAt) != ttl {
					t.Fatalf("challenge %+v (%v), want a lifetime of %s", c, err, ttl)
				}
			}
			_, err = stream.Recv()
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), tc.reason) {
				t.Fatalf("the unanswered stream ended with %v, want DEADLINE_EXCEEDED %q", err, tc.reason)
			}
			if ctx.Err() != nil {
				t.Fatal("the stream ended only with the caller's own deadline")
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				recs, err := a.store.ListAudit(t.Context(), store.AuditFilter{Action: tc.action, AfterSeq: lastSeq(before)})
				if err != nil {
					t.Fatal(err)
				}
				if i := slices.IndexFunc(recs, func(r store.AuditRecord) bool { return strings.Contains(r.Reason, tc.reason) }); i >= 0 {
					if recs[i].Result != audit.ResultDenied {
						t.Fatalf("audited %s %q, want denied", recs[i].Result, recs[i].Reason)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("no %s record says %q: %+v", tc.action, tc.reason, recs)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
